package fsm

import (
	"cmp"
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Checkpoints and forks.
//
// A checkpoint is a claim's memory and disk captured into the store under an
// id. Taking one moves the claim's VM into VMCheckpointing (so no hibernate,
// wake or destroy overlaps the capture) and back when the executor reports;
// the claim keeps its status. A checkpoint is claimable (a new claim cloned
// from its snapshot) until it is doomed: by its owner's delete, its TTL, or,
// for a fork's source, from birth. A doomed checkpoint is removed from the
// store once no VM is cloning from it (refs), so a delete never pulls a
// snapshot out from under a clone.
//
// A fork is a checkpoint of the parent plus its children: pending claims
// whose VMs are requested, cloned from the checkpoint, once it is taken. All
// or nothing: a child that fails (its clone, its serve deadline, the
// capture) fails every sibling, running or pending.

// CheckpointStatus is a checkpoint's state.
type CheckpointStatus uint8

// Checkpoint statuses.
const (
	CheckpointTaking CheckpointStatus = iota + 1
	CheckpointReady
	CheckpointDeleting
	CheckpointImporting // fetched from another node (ckimport.go)
	numCheckpointStatus
)

var checkpointNames = [...]string{"", "taking", "ready", "deleting", "importing"}

func (c CheckpointStatus) String() string { return enumName(checkpointNames[:], int(c)) }

// Checkpoint and fork bounds.
const (
	// DefaultMaxForkCount is the old daemon's max_fork_count default: each
	// child is a full VM, so one request's children are bounded.
	DefaultMaxForkCount = 16
	// MaxCheckpointName bounds a checkpoint's optional name.
	MaxCheckpointName = 64
)

// CheckpointRec is a checkpoint's record.
type CheckpointRec struct {
	ID     string
	Name   string
	Tenant string // who took it (empty: root)
	Claim  string // the sandbox it captures
	VM     string
	Key    PoolKey
	Status CheckpointStatus
	// Fork: a fork's source, never listed nor claimable.
	Fork bool
	// Doomed: deleted (or expired, or a fork's source); removed from the
	// store once no clone reads it.
	Doomed bool
	// FromHibernated: the VM was hibernated, and is exported from Source,
	// its hibernate snapshot; it returns to hibernated. While it is
	// imported (CheckpointImporting), Source is its origin's address.
	FromHibernated bool
	Source         string
	SnapshotDir    string // relative to the store, once taken
	Created        int64
	Expires        int64 // 0: no TTL
	Op             event.OpID
	ReqSeq         uint64
	// Children are a fork's child claims (read-only).
	Children []string
	// refs counts VMs cloning from it (derived).
	refs int
}

// --- commands ----------------------------------------------------------------

// Checkpoint asks for claim Claim to be captured as checkpoint ID (POST
// /v1/sandboxes/{id}/checkpoint). A running claim keeps running (its VM is
// paused only for the snapshot); a hibernated one is exported from its
// hibernate image without waking.
type Checkpoint struct {
	Meta
	// ID is "ck_" + 16 lowercase hex digits, minted by the caller.
	ID     string
	Claim  string
	Tenant string // the caller's tenant, recorded as the checkpoint's owner
	Name   string
	// TTLSeconds: the checkpoint is deleted that long after it is taken
	// (the node's checkpoint TTL); 0 keeps it until deleted.
	TTLSeconds int64
}

// Fork clones claim Parent into len(Children) new claims, all or none (POST
// /v1/sandboxes/{id}/fork). The children inherit the parent's key, tenant and
// egress; they are served once every clone runs, and fail together.
type Fork struct {
	Meta
	Parent string
	// Checkpoint is the fork's source checkpoint id, Children the
	// children's claim ids, all minted by the caller.
	Checkpoint string
	Children   []string
	TokenGen   uint32
	// TTLSeconds is each child's lease (0: the default); never the
	// parent's remainder.
	TTLSeconds          int64
	ServeTimeoutSeconds int64
	// ClaimRefPrefix, when set, makes each child's claim_ref prefix + id.
	ClaimRefPrefix string
	// MaxCount is the node's max_fork_count (0: DefaultMaxForkCount).
	MaxCount int
}

// DeleteCheckpoint dooms checkpoint ID (DELETE /v1/checkpoints/{id}). A
// tenant may delete only its own; the root (empty Tenant) any.
type DeleteCheckpoint struct {
	Meta
	ID     string
	Tenant string
}

// CheckpointTaken reports a checkpoint durable in SnapshotDir.
type CheckpointTaken struct {
	Meta
	Checkpoint  string
	SnapshotDir string
	Report      *event.ExecReport
}

// CheckpointFailed reports a capture rolled back; Lost: the VM died.
type CheckpointFailed struct {
	Meta
	Checkpoint string
	Error      string
	Lost       bool
}

// CheckpointRemoved reports a doomed checkpoint's snapshot removed.
type CheckpointRemoved struct {
	Meta
	Checkpoint string
	Report     *event.ExecReport
}

// ValidCheckpointID reports whether id is "ck_" followed by 16 lowercase hex
// digits.
func ValidCheckpointID(id string) bool { return prefixedHex16(id, "ck_") }

// --- intents -----------------------------------------------------------------

// CaptureCheckpoint: capture VM (running in RunDir, or hibernated in Source)
// into the store as checkpoint Checkpoint; the VM runs on (or stays
// hibernated).
type CaptureCheckpoint struct {
	OpID       event.OpID
	Checkpoint string
	Claim      string
	VM         string
	Key        PoolKey
	Instance   string
	RunDir     string
	Source     string
	Fork       bool
	ReqSeq     uint64
}

func (i CaptureCheckpoint) Kind() IntentKind     { return KindCheckpoint }
func (i CaptureCheckpoint) IntentOp() event.OpID { return i.OpID }
func (i CaptureCheckpoint) Subject() string      { return i.Checkpoint }

// A fork's capture has children waiting for it, as a claim's clone does.
func (i CaptureCheckpoint) order() (int, uint64, string) {
	if i.Fork {
		return classClaimClone, i.ReqSeq, i.Checkpoint
	}
	return classHibernate, i.ReqSeq, i.Checkpoint
}

func (i CaptureCheckpoint) Succeeded(m Meta, out Outcome) Command {
	return CheckpointTaken{Meta: m, Checkpoint: i.Checkpoint, SnapshotDir: out.SnapshotDir, Report: &out.Report}
}

func (i CaptureCheckpoint) Failed(m Meta, msg string, lost bool) Command {
	return CheckpointFailed{Meta: m, Checkpoint: i.Checkpoint, Error: msg, Lost: lost}
}

// RemoveCheckpoint: remove a doomed checkpoint's snapshot from the store.
type RemoveCheckpoint struct {
	OpID        event.OpID
	Checkpoint  string
	SnapshotDir string
	ReqSeq      uint64
}

func (i RemoveCheckpoint) Kind() IntentKind             { return KindCheckpointDelete }
func (i RemoveCheckpoint) IntentOp() event.OpID         { return i.OpID }
func (i RemoveCheckpoint) Subject() string              { return i.Checkpoint }
func (i RemoveCheckpoint) order() (int, uint64, string) { return classDestroy, i.ReqSeq, i.Checkpoint }

func (i RemoveCheckpoint) Succeeded(m Meta, out Outcome) Command {
	return CheckpointRemoved{Meta: m, Checkpoint: i.Checkpoint, Report: &out.Report}
}

// Failed is nil: nothing references a doomed checkpoint any more, so its
// removal is retried until it succeeds.
func (i RemoveCheckpoint) Failed(Meta, string, bool) Command { return nil }

func (s *State) checkpointIntent(ck *CheckpointRec) Intent {
	if ck.Status == CheckpointImporting {
		return s.importIntent(ck)
	}
	if ck.Status == CheckpointDeleting {
		return RemoveCheckpoint{OpID: ck.Op, Checkpoint: ck.ID, SnapshotDir: ck.SnapshotDir, ReqSeq: ck.ReqSeq}
	}
	in := CaptureCheckpoint{OpID: ck.Op, Checkpoint: ck.ID, Claim: ck.Claim, VM: ck.VM, Key: ck.Key, Source: ck.Source, Fork: ck.Fork, ReqSeq: ck.ReqSeq}
	if v := s.vms[ck.VM]; v != nil {
		in.Instance, in.RunDir = v.Instance, v.RunDir
	}
	return in
}

// --- reads -------------------------------------------------------------------

// Checkpoint returns checkpoint id's record (any status).
func (s *State) Checkpoint(id string) (CheckpointRec, bool) {
	ck, ok := s.checkpoints[id]
	if !ok {
		return CheckpointRec{}, false
	}
	return *ck, true
}

// Listed reports whether ck is one of its owner's checkpoints: taken, not a
// fork's source, not doomed. Only a listed checkpoint is claimable.
func (ck *CheckpointRec) Listed() bool {
	return ck.Status == CheckpointReady && !ck.Fork && !ck.Doomed
}

// VisibleTo reports whether a caller of tenant sees ck (the root, tenant "",
// sees every checkpoint).
func (ck *CheckpointRec) VisibleTo(tenant string) bool { return tenant == "" || ck.Tenant == tenant }

// Checkpoints returns the listed checkpoints tenant sees, newest first. It
// costs O(checkpoints): a listing, not a request's hot path.
func (s *State) Checkpoints(tenant string) []CheckpointRec {
	var out []CheckpointRec
	for _, ck := range s.checkpoints { //fsm:unordered sorted below
		if ck.Listed() && ck.VisibleTo(tenant) {
			out = append(out, *ck)
		}
	}
	slices.SortFunc(out, func(a, b CheckpointRec) int {
		if c := cmp.Compare(b.Created, a.Created); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out
}

// CheckpointSnapshots returns the store dirs the checkpoints reference (taken
// ones, doomed ones not yet removed), sorted by dir: what a store collection
// must keep of the checkpoint store.
func (s *State) CheckpointSnapshots() []SnapshotRef {
	var out []SnapshotRef
	for _, ck := range s.checkpoints { //fsm:unordered sorted below
		if ck.SnapshotDir != "" {
			out = append(out, SnapshotRef{Dir: ck.SnapshotDir, Kind: OwnerCheckpoint, Owner: ck.ID})
		}
	}
	slices.SortFunc(out, func(a, b SnapshotRef) int { return cmp.Compare(a.Dir, b.Dir) })
	return out
}

func checkpointSnapshots(s *State, add func(SnapshotRef)) {
	for _, r := range s.CheckpointSnapshots() {
		add(r)
	}
}

// forkChildWaiting reports whether c is a pending fork child whose VM is not
// requested yet (its fork's checkpoint is being taken).
func (s *State) forkChildWaiting(c *ClaimRec) bool {
	if c.Fork == "" || c.Status != ClaimPending {
		return false
	}
	ck := s.checkpoints[c.Fork]
	return ck != nil && ck.Status == CheckpointTaking
}

// runsGuest reports whether a running claim's VM v runs its guest: claimed,
// or being checkpointed or promoted (paused at most for the snapshot), so
// relays open and stay open through both.
func runsGuest(v *VMRec) bool {
	return v != nil && (v.Status == VMClaimed || v.Status == VMCheckpointing || v.Status == VMPromoting)
}

// --- decisions ---------------------------------------------------------------

// captureSource returns claim id and its VM if it can be captured now:
// running or hibernated, settled (settledVM).
func (d *decider) captureSource(id string) (*ClaimRec, *VMRec, error) {
	c, err := d.liveClaim(id)
	if err != nil {
		return nil, nil, err
	}
	if c.Status != ClaimRunning && c.Status != ClaimHibernated {
		return nil, nil, reject(InvalidTransition, "sandbox %s is %s, cannot checkpoint or fork", id, c.Status)
	}
	v, err := d.settled(c)
	if err != nil {
		return nil, nil, err
	}
	return c, v, nil
}

// requestCapture emits the CheckpointRequested of c's VM v.
func (d *decider) requestCapture(id string, c *ClaimRec, v *VMRec, tenant, name string, fork bool, ttl int64) {
	ev := event.CheckpointRequested{Checkpoint: id, Claim: c.ID, VM: v.ID, Key: c.Key, Tenant: tenant, Name: name, Fork: fork}
	if v.Status == VMHibernated {
		ev.Source = v.SnapshotDir
	}
	if ttl > 0 {
		ev.ExpiresNS = d.m.Now + ttl*second
	}
	d.emit(ev, id)
}

func (d *decider) newCheckpointID(id string) error {
	if !ValidCheckpointID(id) {
		return reject(Invalid, "invalid checkpoint id %q: want ck_ and 16 lowercase hex digits", id)
	}
	if _, used := d.s.checkpoints[id]; used {
		return reject(Invalid, "checkpoint id %s is already in use", id)
	}
	return nil
}

func (cmd Checkpoint) decide(d *decider) error {
	if err := d.newCheckpointID(cmd.ID); err != nil {
		return err
	}
	if cmd.Name != "" && !nameRE.MatchString(cmd.Name) {
		return reject(Invalid, "invalid checkpoint name %q: want %s", cmd.Name, nameRE)
	}
	if err := checkText("tenant", cmd.Tenant, MaxTenant); err != nil {
		return err
	}
	if cmd.TTLSeconds < 0 {
		return reject(Invalid, "checkpoint ttl %d s is negative", cmd.TTLSeconds)
	}
	c, v, err := d.captureSource(cmd.Claim)
	if err != nil {
		return err
	}
	d.requestCapture(cmd.ID, c, v, cmd.Tenant, cmd.Name, false, cmd.TTLSeconds)
	return nil
}

func (cmd Fork) decide(d *decider) error {
	s := d.s
	limit := cmd.MaxCount
	if limit <= 0 {
		limit = DefaultMaxForkCount
	}
	n := len(cmd.Children)
	if n < 1 || n > limit {
		return reject(Invalid, "fork count %d not in 1..%d", n, limit)
	}
	if err := d.newCheckpointID(cmd.Checkpoint); err != nil {
		return err
	}
	seen := make(map[string]bool, n)
	for _, id := range cmd.Children {
		if !ValidClaimID(id) || seen[id] || s.claims[id] != nil {
			return reject(Invalid, "invalid or used child claim id %q", id)
		}
		seen[id] = true
		if err := checkText("claim_ref", cmd.ClaimRefPrefix+id, MaxClaimRef); cmd.ClaimRefPrefix != "" && err != nil {
			return err
		}
	}
	ttl, err := ttlSeconds(cmd.TTLSeconds)
	if err != nil {
		return err
	}
	serve, err := serveSeconds(cmd.ServeTimeoutSeconds)
	if err != nil {
		return err
	}
	parent, v, err := d.captureSource(cmd.Parent)
	if err != nil {
		return err
	}
	if err := d.admit(parent.Tenant, n); err != nil {
		return err
	}
	if err := d.needInstance(); err != nil {
		return err
	}
	gen := cmd.TokenGen
	if gen == 0 {
		gen = 1
	}
	d.requestCapture(cmd.Checkpoint, parent, v, parent.Tenant, "", true, 0)
	deadline := d.m.Now + ttl*second
	policy := ""
	if parent.Unpooled {
		policy = PolicyUnpooled
	}
	for _, id := range cmd.Children {
		ev := event.ClaimCreated{Claim: id, Key: parent.Key, VM: d.newVMID(), Tier: TierClone.String(), Tenant: parent.Tenant,
			TTLSeconds: ttl, DeadlineNS: deadline, ServeByNS: min(deadline, d.m.Now+serve*second), TokenGen: gen,
			EgressClass: parent.EgressClass, NoEgress: parent.NoEgress, PolicyLayer: policy, Env: parent.Env, Fork: cmd.Checkpoint}
		if cmd.ClaimRefPrefix != "" {
			ev.ClaimRef = cmd.ClaimRefPrefix + id
		}
		d.emit(ev, id)
	}
	return nil
}

func (cmd DeleteCheckpoint) decide(d *decider) error {
	ck := d.s.checkpoints[cmd.ID]
	if ck == nil || ck.Fork || ck.Doomed || !ck.VisibleTo(cmd.Tenant) {
		return reject(NotFound, "no checkpoint %s", cmd.ID)
	}
	if ck.Status != CheckpointReady {
		return reject(InvalidTransition, "checkpoint %s is %s", cmd.ID, ck.Status)
	}
	d.emit(event.CheckpointDeleteRequested{Checkpoint: ck.ID, Reason: "deleted"}, ck.ID)
	return nil
}

// taking returns the checkpoint a capture result answers.
func (d *decider) taking(id string) (*CheckpointRec, error) {
	ck := d.s.checkpoints[id]
	if ck == nil {
		return nil, reject(NotFound, "no checkpoint %s", id)
	}
	if ck.Status != CheckpointTaking || ck.Op != d.m.Cause {
		return nil, reject(InvalidTransition, "checkpoint %s is %s; stale result (cause %s)", id, ck.Status, d.m.Cause)
	}
	return ck, nil
}

// sourceSettled follows a capture's result on its VM (settleFailure): a VM
// whose claim ended during the capture is destroyed (its release left it
// to this result); lost, a running one fails its claim.
func (d *decider) sourceSettled(ck *CheckpointRec, lost bool, msg string) {
	d.settleFailure(d.s.vms[ck.VM], snapshotSource(ck.FromHibernated), lost && !ck.FromHibernated, "checkpoint_failed", msg)
}

func (c CheckpointTaken) decide(d *decider) error {
	ck, err := d.taking(c.Checkpoint)
	if err != nil {
		return err
	}
	if err := checkDir(c.SnapshotDir); err != nil {
		return err
	}
	d.emit(event.CheckpointTaken{Checkpoint: ck.ID, SnapshotDir: c.SnapshotDir, Report: c.Report}, ck.ID)
	d.sourceSettled(ck, false, "")
	clones := 0
	for _, id := range ck.Children {
		if ch := d.s.claims[id]; ch != nil && ch.Status == ClaimPending {
			d.cloneRequest(ch.VM, ch.Key, ch.ID, false, ck.ID)
			clones++
		}
	}
	if ck.Doomed && clones == 0 {
		// A fork whose children all ended before their source was taken.
		d.emit(event.CheckpointDeleteRequested{Checkpoint: ck.ID, Reason: "fork_failed"}, ck.ID)
	}
	return nil
}

func (c CheckpointFailed) decide(d *decider) error {
	ck, err := d.taking(c.Checkpoint)
	if err != nil {
		return err
	}
	d.emit(event.CheckpointFailed{Checkpoint: ck.ID, Error: errText(c.Error), Lost: c.Lost}, ck.ID)
	d.sourceSettled(ck, c.Lost, c.Error)
	for _, id := range ck.Children {
		if ch := d.s.claims[id]; ch != nil && ch.Status == ClaimPending {
			d.emit(event.ClaimFailed{Claim: ch.ID, VM: ch.VM, Reason: "fork_failed", Error: errText(c.Error)}, ch.ID)
		}
	}
	return nil
}

func (c CheckpointRemoved) decide(d *decider) error {
	ck := d.s.checkpoints[c.Checkpoint]
	if ck == nil {
		return reject(NotFound, "no checkpoint %s", c.Checkpoint)
	}
	if ck.Status != CheckpointDeleting || ck.Op != d.m.Cause {
		return reject(InvalidTransition, "checkpoint %s is %s; stale result (cause %s)", ck.ID, ck.Status, d.m.Cause)
	}
	d.emit(event.CheckpointDeleted{Checkpoint: ck.ID, Report: c.Report}, ck.ID)
	return nil
}

// clonedFrom follows a clone's result (v still cloning in the state): the
// last clone reading a doomed checkpoint asks for its removal.
func (d *decider) clonedFrom(v *VMRec) {
	ck := d.s.checkpoints[v.SourceCk]
	if ck != nil && ck.Doomed && ck.refs == 1 {
		d.emit(event.CheckpointDeleteRequested{Checkpoint: ck.ID, Reason: "unreferenced"}, ck.ID)
	}
}

// failFork fails every live sibling of fork child except (its fork's other
// children), destroying the VMs of those already running, and returns the
// claims it ended.
func (d *decider) failFork(fork, except, msg string) []string {
	ck := d.s.checkpoints[fork]
	if ck == nil {
		return nil
	}
	var ended []string
	for _, id := range ck.Children {
		c := d.s.claims[id]
		if id == except || c == nil || !c.Status.Live() {
			continue
		}
		d.closeRelays(id, "failed")
		d.emit(event.ClaimFailed{Claim: id, VM: c.VM, Reason: "fork_failed", Error: errText(msg)}, id)
		d.destroySettled(c.VM, "failed")
		ended = append(ended, id)
	}
	return ended
}

// expireCheckpoint fires checkpoint id's TTL.
func (d *decider) expireCheckpoint(id string) {
	if ck := d.s.checkpoints[id]; ck != nil && ck.Listed() {
		d.emit(event.CheckpointDeleteRequested{Checkpoint: id, Reason: "expired"}, id)
	}
}

// claimableCheckpoint returns checkpoint id if a claim may be cloned from it.
func (d *decider) claimableCheckpoint(id string) (*CheckpointRec, error) {
	ck := d.s.checkpoints[id]
	if ck == nil || !ck.Listed() {
		return nil, reject(NotFound, "no checkpoint %s", id)
	}
	return ck, nil
}

// --- transitions -------------------------------------------------------------

func (a *applier) checkpointRequested(p event.CheckpointRequested) error {
	s := a.s
	if _, dup := s.checkpoints[p.Checkpoint]; dup || p.Checkpoint == "" {
		return inconsistent("checkpoint id %q already in use", p.Checkpoint)
	}
	c, err := a.claim(p.Claim, ClaimRunning, ClaimHibernated)
	if err != nil {
		return err
	}
	v, err := a.vm(p.VM, VMClaimed, VMHibernated)
	if err != nil {
		return err
	}
	if c.VM != v.ID || v.Claim != c.ID {
		return inconsistent("checkpoint %s of claim %s: VM %s is not its", p.Checkpoint, c.ID, v.ID)
	}
	ck := &CheckpointRec{ID: p.Checkpoint, Name: p.Name, Tenant: p.Tenant, Claim: c.ID, VM: v.ID, Key: c.Key,
		Status: CheckpointTaking, Fork: p.Fork, Doomed: p.Fork, FromHibernated: v.Status == VMHibernated, Source: p.Source,
		Created: a.ev.Time, Expires: p.ExpiresNS, Op: a.intentOp(), ReqSeq: a.seq}
	s.checkpoints[ck.ID] = ck
	s.pendingCks[ck.ID] = struct{}{}
	s.setVMStatus(v, VMCheckpointing)
	return nil
}

func (a *applier) taking(id string) (*CheckpointRec, *VMRec, error) {
	ck := a.s.checkpoints[id]
	if ck == nil || ck.Status != CheckpointTaking {
		return nil, nil, inconsistent("checkpoint %s is not being taken", id)
	}
	v, err := a.vm(ck.VM, VMCheckpointing)
	if err != nil {
		return nil, nil, err
	}
	return ck, v, nil
}

// snapshotSource is the status a claim returns to once a snapshot of it (a
// checkpoint's capture, a promote) settles: running, or hibernated; its VM
// returns to claimVMStatus of it.
func snapshotSource(hibernated bool) ClaimStatus {
	if hibernated {
		return ClaimHibernated
	}
	return ClaimRunning
}

func (a *applier) checkpointTaken(p event.CheckpointTaken) error {
	s := a.s
	ck, v, err := a.taking(p.Checkpoint)
	if err != nil {
		return err
	}
	ck.Status, ck.Op, ck.SnapshotDir = CheckpointReady, event.ZeroOpID, p.SnapshotDir
	delete(s.pendingCks, ck.ID)
	s.setVMStatus(v, claimVMStatus[snapshotSource(ck.FromHibernated)])
	s.syncCheckpointTimer(ck)
	return nil
}

func (a *applier) checkpointFailed(p event.CheckpointFailed) error {
	s := a.s
	ck, v, err := a.taking(p.Checkpoint)
	if err != nil {
		return err
	}
	s.setVMStatus(v, claimVMStatus[snapshotSource(ck.FromHibernated)])
	delete(s.pendingCks, ck.ID)
	delete(s.checkpoints, ck.ID)
	return nil
}

func (a *applier) checkpointDeleteRequested(p event.CheckpointDeleteRequested) error {
	s := a.s
	ck := s.checkpoints[p.Checkpoint]
	if ck == nil || ck.Status != CheckpointReady {
		return inconsistent("delete of checkpoint %s, which is not taken", p.Checkpoint)
	}
	ck.Doomed = true
	if ck.refs == 0 {
		ck.Status, ck.Op, ck.ReqSeq = CheckpointDeleting, a.intentOp(), a.seq
		s.pendingCks[ck.ID] = struct{}{}
	}
	s.syncCheckpointTimer(ck)
	return nil
}

func (a *applier) checkpointDeleted(p event.CheckpointDeleted) error {
	s := a.s
	ck := s.checkpoints[p.Checkpoint]
	if ck == nil || ck.Status != CheckpointDeleting {
		return inconsistent("checkpoint %s is not being deleted", p.Checkpoint)
	}
	delete(s.pendingCks, ck.ID)
	delete(s.checkpoints, ck.ID)
	return nil
}

// cloneSource takes a VM clone request's checkpoint reference.
func (a *applier) cloneSource(v *VMRec, id string) error {
	if id == "" {
		return nil
	}
	ck := a.s.checkpoints[id]
	if ck == nil || ck.Status != CheckpointReady {
		return inconsistent("VM %s cloned from checkpoint %s, which is not taken", v.ID, id)
	}
	ck.refs++
	v.SourceCk = id
	return nil
}

// cloneSettled drops a settled clone's checkpoint reference.
func (s *State) cloneSettled(v *VMRec) {
	if ck := s.checkpoints[v.SourceCk]; ck != nil {
		ck.refs--
	}
	v.SourceCk = ""
}

// forkChild records a fork's child claim on its source checkpoint.
func (a *applier) forkChild(c *ClaimRec, fork string) error {
	if fork == "" {
		return nil
	}
	ck := a.s.checkpoints[fork]
	if ck == nil || !ck.Fork || ck.Status != CheckpointTaking {
		return inconsistent("claim %s: fork %s is not being taken", c.ID, fork)
	}
	// A new slice each time: records handed out by Checkpoint() share it.
	ck.Children = append(slices.Clip(ck.Children), c.ID)
	c.Fork = fork
	return nil
}

// checkpointTimer returns when ck's TTL fires, false when none is armed.
func checkpointTimer(ck *CheckpointRec) (int64, bool) {
	return ck.Expires, ck.Expires > 0 && ck.Listed()
}

func (s *State) syncCheckpointTimer(ck *CheckpointRec) {
	at, on := checkpointTimer(ck)
	s.armIf(timerKey{kind: tCheckpoint, id: ck.ID}, on, at)
}

// --- invariants and encoding -------------------------------------------------

// checkCheckpoints verifies the checkpoint records and their indexes, and
// returns how many timers they arm.
func (s *State) checkCheckpoints(fail func(string, ...any), checkTimer func(*timerHeap, timerKey, int64)) int {
	refs := map[string]int{}
	for id, v := range s.vms { //fsm:unordered verification only
		if v.SourceCk == "" {
			continue
		}
		refs[v.SourceCk]++
		if v.Status != VMCloning {
			fail("VM %s (%s) still references checkpoint %s", id, v.Status, v.SourceCk)
		}
	}
	capturing := 0
	timers := 0
	for id, ck := range s.checkpoints { //fsm:unordered verification only
		if ck.Status < CheckpointTaking || ck.Status >= numCheckpointStatus {
			fail("checkpoint %s: status %d", id, ck.Status)
		}
		_, pending := s.pendingCks[id]
		if pending != (ck.Status != CheckpointReady) || (ck.Op == event.ZeroOpID) == pending {
			fail("checkpoint %s (%s): pending %v, op %s", id, ck.Status, pending, ck.Op)
		}
		if ck.refs != refs[id] || (ck.refs > 0 && ck.Status != CheckpointReady) {
			fail("checkpoint %s (%s): %d refs, VMs say %d", id, ck.Status, ck.refs, refs[id])
		}
		if ck.Fork && !ck.Doomed {
			fail("fork checkpoint %s is not doomed", id)
		}
		if (ck.SnapshotDir == "") != (ck.Status == CheckpointTaking || ck.Status == CheckpointImporting) {
			fail("checkpoint %s (%s): snapshot dir %q", id, ck.Status, ck.SnapshotDir)
		}
		if ck.Status == CheckpointTaking {
			capturing++
			if v := s.vms[ck.VM]; v == nil || v.Status != VMCheckpointing {
				fail("checkpoint %s being taken: VM %s is not checkpointing", id, ck.VM)
			}
		}
		if at, on := checkpointTimer(ck); on {
			checkTimer(&s.timers, timerKey{kind: tCheckpoint, id: id}, at)
			timers++
		}
	}
	if capturing != s.vmCount[VMCheckpointing] {
		fail("%d checkpoints being taken, %d VMs checkpointing", capturing, s.vmCount[VMCheckpointing])
	}
	if len(s.pendingCks) > len(s.checkpoints) {
		fail("pending checkpoint index has unknown ids")
	}
	return timers
}

// checkpoints writes the V6 section: n checkpoints × (id, name, tenant,
// claim, vm, key, status, fork, doomed, from hibernated, source, snapshot dir,
// created, expires (varints), op, req seq, n children × id); n VMs with a
// source checkpoint × (id, checkpoint); n claims of a checkpoint or fork ×
// (id, from checkpoint, fork).
func (e *encoder) checkpoints(s *State) {
	ids := sortedKeys(s.checkpoints)
	e.u(uint64(len(ids)))
	for _, id := range ids {
		ck := s.checkpoints[id]
		e.str(ck.ID)
		e.str(ck.Name)
		e.str(ck.Tenant)
		e.str(ck.Claim)
		e.str(ck.VM)
		e.key(ck.Key)
		e.u(uint64(ck.Status))
		e.bool(ck.Fork)
		e.bool(ck.Doomed)
		e.bool(ck.FromHibernated)
		e.str(ck.Source)
		e.str(ck.SnapshotDir)
		e.i(ck.Created)
		e.i(ck.Expires)
		e.op(ck.Op)
		e.u(ck.ReqSeq)
		e.u(uint64(len(ck.Children)))
		for _, c := range ck.Children {
			e.str(c)
		}
	}
	vms := e.vmsWhere(s, func(v *VMRec) bool { return v.SourceCk != "" })
	e.u(uint64(len(vms)))
	for _, id := range vms {
		e.str(id)
		e.str(s.vms[id].SourceCk)
	}
	claims := e.claimsWhere(s, func(c *ClaimRec) bool { return c.FromCheckpoint != "" || c.Fork != "" })
	e.u(uint64(len(claims)))
	for _, id := range claims {
		c := s.claims[id]
		e.str(id)
		e.str(c.FromCheckpoint)
		e.str(c.Fork)
	}
}

func (d *sdec) checkpoints(s *State) {
	for range d.count() {
		ck := &CheckpointRec{ID: d.str(), Name: d.str(), Tenant: d.istr(), Claim: d.str(), VM: d.str(), Key: d.key()}
		ck.Status = CheckpointStatus(d.u())
		ck.Fork = d.bool()
		ck.Doomed = d.bool()
		ck.FromHibernated = d.bool()
		ck.Source = d.str()
		ck.SnapshotDir = d.str()
		ck.Created = d.i()
		ck.Expires = d.i()
		ck.Op = d.op()
		ck.ReqSeq = d.u()
		if n := d.count(); n > 0 {
			ck.Children = make([]string, n)
			for i := range ck.Children {
				ck.Children[i] = d.str()
			}
		}
		d.check(ck.Status >= CheckpointTaking && ck.Status < numCheckpointStatus && s.checkpoints[ck.ID] == nil, "checkpoint %s", ck.ID)
		if d.err != nil {
			return
		}
		s.checkpoints[ck.ID] = ck
	}
	for range d.count() {
		v := s.vms[d.str()]
		id := d.str()
		d.check(v != nil && s.checkpoints[id] != nil, "VM source checkpoint %s", id)
		if d.err != nil {
			return
		}
		v.SourceCk = id
	}
	for range d.count() {
		c := s.claims[d.str()]
		from, fork := d.str(), d.str()
		d.check(c != nil, "claim of checkpoint %s / fork %s", from, fork)
		if d.err != nil {
			return
		}
		c.FromCheckpoint, c.Fork = from, fork
	}
}

// rebuildCheckpoints derives the checkpoint indexes (refs, pending, timers;
// the caller heapifies).
func (s *State) rebuildCheckpoints() {
	for _, v := range s.vms { //fsm:unordered counters only
		if ck := s.checkpoints[v.SourceCk]; ck != nil {
			ck.refs++
		}
	}
	for id, ck := range s.checkpoints { //fsm:unordered sets and heap pushes; heapify follows
		if ck.Status != CheckpointReady {
			s.pendingCks[id] = struct{}{}
		}
		if at, on := checkpointTimer(ck); on {
			s.timers.push(timerKey{kind: tCheckpoint, id: id}, at)
		}
	}
}
