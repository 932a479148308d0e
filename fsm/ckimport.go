package fsm

import (
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Checkpoint import: a checkpoint another node took, made this node's.
//
// A claim of a checkpoint this node does not hold, whose id's tag names
// another node, asks for it (ImportCheckpoint, with the origin's address the
// cluster view gives). The record exists from the request on, in
// CheckpointImporting, unlisted and unclaimable; concurrent claims of the
// same id share it (a second request is a no-op). The executor fetches the
// checkpoint over the transport (GET /v1/checkpoints/{id}/blob on the
// origin), verifies it and publishes it into this node's store; its result
// makes the record a ready checkpoint with what the origin recorded (key,
// name, tenant, the sandbox it captured, created, expires), held by this
// node from then on like one it took: listed, claimable, deletable, expired
// by the same TTL as at its origin. A failed import leaves nothing: the
// record goes, and the next claim asks again.

// KindCheckpointImport fetches a checkpoint from another node.
const KindCheckpointImport IntentKind = "checkpoint_import"

// MaxOriginAddr bounds an import's origin address (host:port).
const MaxOriginAddr = 256

// Import failure reasons (event.CheckpointImportFailed.Reason). The
// executor's error text carries one followed by ": " (after the executors'
// own prefix, "unrecoverable: "); anything else is ImportRefused.
const (
	ImportNotFound    = "not_found"   // the origin holds no such checkpoint
	ImportUnreachable = "unreachable" // the origin did not answer
	ImportRefused     = "refused"     // what it sent is not taken here
)

// CheckpointMeta is what an import learned of a checkpoint from its origin
// (Outcome.Checkpoint).
type CheckpointMeta struct {
	Key              PoolKey
	Name, Tenant     string
	Claim            string // the sandbox it captured at its origin
	Created, Expires int64  // unix ns; Expires 0: no TTL
}

// ImportCheckpoint asks for checkpoint ID to be fetched from the node at
// Origin (host:port). A no-op when this node holds ID already or is
// fetching it; NotFound when it holds ID in any other state (doomed, a
// fork's source, being taken).
type ImportCheckpoint struct {
	Meta
	ID     string
	Origin string
}

// CheckpointImported reports an import durable in SnapshotDir.
type CheckpointImported struct {
	Meta
	Checkpoint  string
	SnapshotDir string
	Imported    CheckpointMeta
	Report      *event.ExecReport
}

// CheckpointImportFailed reports an import rolled back.
type CheckpointImportFailed struct {
	Meta
	Checkpoint string
	Error      string
}

// FetchCheckpoint: fetch checkpoint Checkpoint from Origin, verify it and
// publish it into the store (layout's checkpoint dir of its id).
type FetchCheckpoint struct {
	OpID       event.OpID
	Checkpoint string
	Origin     string
	ReqSeq     uint64
}

func (i FetchCheckpoint) Kind() IntentKind     { return KindCheckpointImport }
func (i FetchCheckpoint) IntentOp() event.OpID { return i.OpID }
func (i FetchCheckpoint) Subject() string      { return i.Checkpoint }

// A claim waits for it, as for an on-demand clone.
func (i FetchCheckpoint) order() (int, uint64, string) {
	return classClaimClone, i.ReqSeq, i.Checkpoint
}

func (i FetchCheckpoint) Succeeded(m Meta, out Outcome) Command {
	c := CheckpointImported{Meta: m, Checkpoint: i.Checkpoint, SnapshotDir: out.SnapshotDir, Report: &out.Report}
	if out.Checkpoint != nil {
		c.Imported = *out.Checkpoint
	}
	return c
}

func (i FetchCheckpoint) Failed(m Meta, msg string, _ bool) Command {
	return CheckpointImportFailed{Meta: m, Checkpoint: i.Checkpoint, Error: msg}
}

// ImportFailureReason is the reason an import's error text msg carries:
// the first one in it, as the executor puts its reason ahead of the text it
// wraps, which may quote the origin's own answer (and so another reason).
func ImportFailureReason(msg string) string {
	reason, at := ImportRefused, len(msg)
	for _, r := range []string{ImportNotFound, ImportUnreachable, ImportRefused} {
		if i := strings.Index(msg, r+": "); i >= 0 && i < at {
			reason, at = r, i
		}
	}
	return reason
}

func (cmd ImportCheckpoint) decide(d *decider) error {
	if !ValidCheckpointID(cmd.ID) {
		return reject(Invalid, "invalid checkpoint id %q: want ck_ and 16 lowercase hex digits", cmd.ID)
	}
	if cmd.Origin == "" || len(cmd.Origin) > MaxOriginAddr || strings.ContainsAny(cmd.Origin, "/ ") {
		return reject(Invalid, "invalid origin address %q", cmd.Origin)
	}
	if ck := d.s.checkpoints[cmd.ID]; ck != nil {
		if ck.Status == CheckpointImporting || ck.Listed() {
			return nil
		}
		return reject(NotFound, "no checkpoint %s", cmd.ID)
	}
	d.emit(event.CheckpointImportRequested{Checkpoint: cmd.ID, Origin: cmd.Origin}, cmd.ID)
	return nil
}

// importing returns the checkpoint an import result answers.
func (d *decider) importing(id string) (*CheckpointRec, error) {
	ck := d.s.checkpoints[id]
	if ck == nil {
		return nil, reject(NotFound, "no checkpoint %s", id)
	}
	if ck.Status != CheckpointImporting || ck.Op != d.m.Cause {
		return nil, reject(InvalidTransition, "checkpoint %s is %s; stale result (cause %s)", id, ck.Status, d.m.Cause)
	}
	return ck, nil
}

func (c CheckpointImported) decide(d *decider) error {
	ck, err := d.importing(c.Checkpoint)
	if err != nil {
		return err
	}
	if err := checkDir(c.SnapshotDir); err != nil {
		return err
	}
	m := c.Imported
	if err := ValidKey(m.Key); err != nil {
		return err
	}
	if m.Name != "" && !nameRE.MatchString(m.Name) {
		return reject(Invalid, "invalid checkpoint name %q: want %s", m.Name, nameRE)
	}
	if err := checkText("tenant", m.Tenant, MaxTenant); err != nil {
		return err
	}
	if m.Claim != "" && !ValidClaimID(m.Claim) {
		return reject(Invalid, "invalid sandbox id %q", m.Claim)
	}
	if m.Created <= 0 || m.Expires < 0 {
		return reject(Invalid, "checkpoint %s: created %d, expires %d", ck.ID, m.Created, m.Expires)
	}
	d.emit(event.CheckpointImported{Checkpoint: ck.ID, SnapshotDir: c.SnapshotDir, Key: m.Key, Name: m.Name, Tenant: m.Tenant,
		Claim: m.Claim, CreatedNS: m.Created, ExpiresNS: m.Expires, Report: c.Report}, ck.ID)
	return nil
}

func (c CheckpointImportFailed) decide(d *decider) error {
	ck, err := d.importing(c.Checkpoint)
	if err != nil {
		return err
	}
	d.emit(event.CheckpointImportFailed{Checkpoint: ck.ID, Reason: ImportFailureReason(c.Error), Error: errText(c.Error)}, ck.ID)
	return nil
}

func (s *State) importIntent(ck *CheckpointRec) Intent {
	return FetchCheckpoint{OpID: ck.Op, Checkpoint: ck.ID, Origin: ck.Source, ReqSeq: ck.ReqSeq}
}

// applyCheckpointImport applies the import's events; ok is false for any
// other payload.
func (a *applier) applyCheckpointImport(p event.Payload) (ok bool, err error) {
	s := a.s
	switch p := p.(type) {
	case event.CheckpointImportRequested:
		if _, dup := s.checkpoints[p.Checkpoint]; dup || p.Checkpoint == "" {
			return true, inconsistent("checkpoint id %q already in use", p.Checkpoint)
		}
		// Source holds the origin's address while the import runs.
		ck := &CheckpointRec{ID: p.Checkpoint, Status: CheckpointImporting, Source: p.Origin, Created: a.ev.Time, Op: a.intentOp(), ReqSeq: a.seq}
		s.checkpoints[ck.ID] = ck
		s.pendingCks[ck.ID] = struct{}{}
	case event.CheckpointImported:
		ck := s.checkpoints[p.Checkpoint]
		if ck == nil || ck.Status != CheckpointImporting {
			return true, inconsistent("checkpoint %s is not being imported", p.Checkpoint)
		}
		ck.Status, ck.Op, ck.SnapshotDir = CheckpointReady, event.ZeroOpID, p.SnapshotDir
		ck.Key, ck.Name, ck.Tenant, ck.Claim, ck.Created, ck.Expires = p.Key, p.Name, p.Tenant, p.Claim, p.CreatedNS, p.ExpiresNS
		delete(s.pendingCks, ck.ID)
		s.syncCheckpointTimer(ck)
	case event.CheckpointImportFailed:
		ck := s.checkpoints[p.Checkpoint]
		if ck == nil || ck.Status != CheckpointImporting {
			return true, inconsistent("checkpoint %s is not being imported", p.Checkpoint)
		}
		delete(s.pendingCks, ck.ID)
		delete(s.checkpoints, ck.ID)
	default:
		return false, nil
	}
	return true, nil
}
