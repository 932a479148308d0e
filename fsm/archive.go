package fsm

import (
	"github.com/sbxlog/sbxlog/eventlog/event"
)

// The archive: a hibernated VM's snapshot moved to the node's second store
// and back. A VM goes hibernated -> archiving -> archived (its snapshot
// only in the archive, SnapshotDir empty, Archive naming it) and, for a
// wake, archived -> unarchiving -> hibernated -> waking (the normal wake,
// from the snapshot copied back). Its claim stays hibernated throughout
// (waking while its VM unarchives), so every claim rule about hibernated
// claims holds; the API shows it as archived.
//
// What archives, as the old daemon: a claim whose on_expire is "archive"
// at the end of its lease (a running one hibernates first, then archives),
// a hibernated claim whose pool has archive_after_seconds that long after
// its last activity, and a hibernated claim at the end of its lease when
// its pool archives. An archived claim's deadline becomes its pool's
// archive_delete_after_seconds from the archive (0: kept until released),
// and the end of that deadline ends the claim and deletes the archive; a
// wake from the archive grants a fresh lease of the claim's length. A
// failed archive leaves the snapshot local and is retried after
// ArchiveRetryNS; it never falls back to a destroy. Every one of these is
// a timer (tTTL, tArchive), never a scan.

// ArchiveRetryNS is how long after a failed archive (or a failed hibernate
// at an archiving expiry) the next attempt is made.
const ArchiveRetryNS = 30 * second

// Intent kinds of the archive.
const (
	KindArchive       IntentKind = "archive"
	KindUnarchive     IntentKind = "unarchive"
	KindArchiveDelete IntentKind = "archive_delete"
)

// ArchiveVM: copy the hibernated VM's snapshot (SnapshotDir, relative to
// the store) into the archive, verify it, then remove the local copy. The
// result's Outcome.SnapshotDir names the archive.
type ArchiveVM struct {
	OpID        event.OpID
	Claim       string
	VM          string
	Key         PoolKey
	Instance    string
	SnapshotDir string
	ReqSeq      uint64
}

func (i ArchiveVM) Kind() IntentKind             { return KindArchive }
func (i ArchiveVM) IntentOp() event.OpID         { return i.OpID }
func (i ArchiveVM) Subject() string              { return i.VM }
func (i ArchiveVM) order() (int, uint64, string) { return classHibernate, i.ReqSeq, i.VM }

func (i ArchiveVM) Succeeded(m Meta, out Outcome) Command {
	return ArchiveDone{Meta: m, VM: i.VM, Archive: out.SnapshotDir, Report: &out.Report}
}

func (i ArchiveVM) Failed(m Meta, msg string, lost bool) Command {
	return ArchiveFailed{Meta: m, VM: i.VM, Error: msg, Lost: lost}
}

// UnarchiveVM: copy the archive back into the local store, verifying every
// file's checksum, then delete it from the archive. The result's
// Outcome.SnapshotDir is the local snapshot the wake restores from.
type UnarchiveVM struct {
	OpID     event.OpID
	Claim    string
	VM       string
	Key      PoolKey
	Instance string
	Archive  string
	ReqSeq   uint64
}

func (i UnarchiveVM) Kind() IntentKind     { return KindUnarchive }
func (i UnarchiveVM) IntentOp() event.OpID { return i.OpID }
func (i UnarchiveVM) Subject() string      { return i.VM }

// An unarchive is the first half of a wake: it ranks with wakes.
func (i UnarchiveVM) order() (int, uint64, string) { return classWake, i.ReqSeq, i.VM }

func (i UnarchiveVM) Succeeded(m Meta, out Outcome) Command {
	return UnarchiveDone{Meta: m, VM: i.VM, SnapshotDir: out.SnapshotDir, Report: &out.Report}
}

func (i UnarchiveVM) Failed(m Meta, msg string, lost bool) Command {
	return UnarchiveFailed{Meta: m, VM: i.VM, Error: msg, Lost: lost}
}

// DeleteArchiveVM is the destroy of an archived VM: its archive is deleted
// (and any local leftover: SnapshotDir, RunDir). Its result is the
// destroy's, VMDestroyed.
type DeleteArchiveVM struct {
	OpID        event.OpID
	VM          string
	Key         PoolKey
	Instance    string
	RunDir      string
	Archive     string
	SnapshotDir string
	ReqSeq      uint64
}

func (i DeleteArchiveVM) Kind() IntentKind             { return KindArchiveDelete }
func (i DeleteArchiveVM) IntentOp() event.OpID         { return i.OpID }
func (i DeleteArchiveVM) Subject() string              { return i.VM }
func (i DeleteArchiveVM) order() (int, uint64, string) { return classDestroy, i.ReqSeq, i.VM }

func (i DeleteArchiveVM) Succeeded(m Meta, out Outcome) Command {
	return VMDestroyed{Meta: m, VM: i.VM, Report: &out.Report}
}

// Failed is nil, as a destroy's: it is retried until it succeeds.
func (i DeleteArchiveVM) Failed(Meta, string, bool) Command { return nil }

// archiveIntents are the vmIntents entries of the archive's statuses, and
// the destroy of an archived VM.
func archiveIntent(s *State, v *VMRec) Intent {
	switch v.Status {
	case VMArchiving:
		return ArchiveVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, Instance: v.Instance, SnapshotDir: v.SnapshotDir, ReqSeq: v.ReqSeq}
	case VMUnarchiving:
		return UnarchiveVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, Instance: v.Instance, Archive: v.Archive, ReqSeq: v.ReqSeq}
	}
	return DeleteArchiveVM{OpID: v.Op, VM: v.ID, Key: v.Key, Instance: v.Instance, RunDir: v.RunDir, Archive: v.Archive, SnapshotDir: v.SnapshotDir, ReqSeq: v.ReqSeq}
}

// --- commands ------------------------------------------------------------------

// ArchiveDone reports a VM's snapshot archived as Archive (the local copy
// removed).
type ArchiveDone struct {
	Meta
	VM      string
	Archive string
	Report  *event.ExecReport
}

// ArchiveFailed reports an archive rolled back (the local snapshot intact)
// or, with Lost, a local snapshot that is unusable.
type ArchiveFailed struct {
	Meta
	VM    string
	Error string
	Lost  bool
}

// UnarchiveDone reports an archive copied back into SnapshotDir (verified)
// and deleted from the archive.
type UnarchiveDone struct {
	Meta
	VM          string
	SnapshotDir string
	Report      *event.ExecReport
}

// UnarchiveFailed reports a copy back that failed with the archive intact
// or, with Lost, an archive that is unusable.
type UnarchiveFailed struct {
	Meta
	VM    string
	Error string
	Lost  bool
}

func (c ArchiveDone) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMArchiving)
	if err != nil {
		return err
	}
	if err := checkDir(c.Archive); err != nil {
		return err
	}
	cl := d.claimWaiting(v, ClaimHibernated)
	var retain int64
	if p := d.s.pools[v.Key]; p != nil && p.Spec.ArchiveDeleteAfterSeconds > 0 {
		retain = d.m.Now + p.Spec.ArchiveDeleteAfterSeconds*second
	}
	d.emit(event.Archived{Claim: v.Claim, VM: v.ID, Archive: c.Archive, RetainUntilNS: retain, Report: c.Report}, v.Claim)
	if cl == nil {
		d.destroy(v.ID, "claim_ended")
	}
	return nil
}

func (c ArchiveFailed) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMArchiving)
	if err != nil {
		return err
	}
	d.emit(event.ArchiveFailed{Claim: v.Claim, VM: v.ID, Error: errText(c.Error), Lost: c.Lost, RetryAtNS: d.m.Now + ArchiveRetryNS}, v.Claim)
	d.settleFailure(v, ClaimHibernated, c.Lost, "archive_failed", c.Error)
	return nil
}

func (c UnarchiveDone) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMUnarchiving)
	if err != nil {
		return err
	}
	if err := checkDir(c.SnapshotDir); err != nil {
		return err
	}
	cl := d.claimWaiting(v, ClaimWaking)
	var deadline int64
	if cl != nil {
		// A wake from the archive is a fresh lease of the claim's length.
		deadline = d.m.Now + cl.TTLSeconds*second
	}
	d.emit(event.Unarchived{Claim: v.Claim, VM: v.ID, SnapshotDir: c.SnapshotDir, DeadlineNS: deadline, Report: c.Report}, v.Claim)
	if cl == nil {
		d.destroy(v.ID, "claim_ended")
		return nil
	}
	// The VM is hibernated again, from a local snapshot: the wake proper.
	d.emit(event.WakeRequested{Claim: cl.ID, VM: v.ID, SnapshotDir: c.SnapshotDir}, cl.ID)
	return nil
}

func (c UnarchiveFailed) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMUnarchiving)
	if err != nil {
		return err
	}
	d.emit(event.UnarchiveFailed{Claim: v.Claim, VM: v.ID, Error: errText(c.Error), Lost: c.Lost}, v.Claim)
	d.settleFailure(v, ClaimWaking, c.Lost, "unarchive_failed", c.Error)
	return nil
}

// wakeArchive is Wake's decision for a hibernated claim whose VM is in the
// archive's hands: an archived VM is copied back first (the wake follows),
// one being archived is refused until that settles. handled is false for a
// VM the normal wake takes.
func (d *decider) wakeArchive(c *ClaimRec, v *VMRec) (handled bool, err error) {
	switch v.Status {
	case VMArchived:
		d.emit(event.UnarchiveRequested{Claim: c.ID, VM: v.ID, Archive: v.Archive}, c.ID)
		return true, nil
	case VMArchiving:
		return true, reject(InvalidTransition, "sandbox %s is being archived: wake it once that is done", c.ID)
	}
	return false, nil
}

// archivedClaim reports whether c's snapshot is in (or on its way to) the
// archive: such a claim's deadline is its archive's retention, which a
// renew must not overwrite (the old daemon's 409: wake it first).
func (s *State) archivedClaim(c *ClaimRec) bool {
	v := s.vms[c.VM]
	return v != nil && (v.Status == VMArchived || v.Status == VMArchiving || v.Status == VMUnarchiving)
}

// Archived reports whether claim c's snapshot is in the archive (done, not
// on its way there or back), for the API's archived flag.
func (s *State) Archived(c *ClaimRec) bool {
	v := s.vms[c.VM]
	return v != nil && v.Status == VMArchived
}

// validOnExpire checks a command's on_expire ("" keeps the default or the
// current action).
func validOnExpire(v string) error {
	switch v {
	case "", event.OnExpireDestroy, event.OnExpireArchive:
		return nil
	}
	return reject(Invalid, "on_expire %q must be destroy or archive", v)
}

// archiveSettingsValid checks a pool's archive settings as the old daemon
// did: not negative, and archive_after_seconds above idle_hibernate_seconds
// when both are set (a claim hibernates before it archives).
func archiveSettingsValid(p PoolSpec) error {
	switch {
	case p.ArchiveAfterSeconds < 0 || p.ArchiveAfterSeconds > MaxIdleSeconds:
		return reject(Invalid, "pool %s: archive_after_seconds %d out of [0, %d]", p.PoolKey, p.ArchiveAfterSeconds, MaxIdleSeconds)
	case p.ArchiveDeleteAfterSeconds < 0 || p.ArchiveDeleteAfterSeconds > MaxArchiveRetentionSeconds:
		return reject(Invalid, "pool %s: archive_delete_after_seconds %d out of [0, %d]", p.PoolKey, p.ArchiveDeleteAfterSeconds, MaxArchiveRetentionSeconds)
	case p.ArchiveAfterSeconds > 0 && p.IdleHibernateSeconds > 0 && p.ArchiveAfterSeconds <= p.IdleHibernateSeconds:
		return reject(Invalid, "pool %s: archive_after_seconds %d must be above idle_hibernate_seconds %d", p.PoolKey, p.ArchiveAfterSeconds, p.IdleHibernateSeconds)
	}
	return nil
}

// MaxArchiveRetentionSeconds bounds archive_delete_after_seconds (a year).
const MaxArchiveRetentionSeconds = 365 * 86400

// --- timers --------------------------------------------------------------------

// ExpiryArchives reports whether the end of c's lease archives it (or has
// archived it) rather than ending it.
func (s *State) ExpiryArchives(c *ClaimRec) bool { return s.archivesAtExpiry(c) }

// archivesAtExpiry reports whether the end of c's lease archives it rather
// than ending it: its on_expire says so, or it is hibernated in a pool that
// archives.
func (s *State) archivesAtExpiry(c *ClaimRec) bool {
	if c.OnExpireArchive {
		return true
	}
	p := s.pools[c.Key]
	return c.Status == ClaimHibernated && p != nil && p.Spec.ArchiveAfterSeconds > 0
}

// ttlTimer is the lease timer of a live, served claim. An archived claim's
// deadline (also while it is copied back) is its archive's retention (none
// when 0). A claim whose expiry archives has the timer only while the Tick
// can act on it: the claim is settled (settledVM: running with a claimed
// VM, to hibernate, or hibernated with a local snapshot, to archive; no
// volume operation in flight), and not before a failed attempt's retry
// time. Unsettled it has none, and what settles it re-arms it (the result
// of the side effect in flight through setVMStatus, a volume's through
// setClaimVolumes).
func (s *State) ttlTimer(c *ClaimRec) (int64, bool) {
	v := s.vms[c.VM]
	if v != nil && (v.Status == VMArchived || v.Status == VMUnarchiving) {
		return c.Deadline, c.Deadline != 0
	}
	if !s.archivesAtExpiry(c) {
		return c.Deadline, true
	}
	if _, ok := s.settledVM(c); !ok {
		return 0, false
	}
	return max(c.Deadline, c.ArchiveRetryAt), true
}

// archiveTimer is the pool's archive_after_seconds timer of a hibernated
// claim whose snapshot is still local, armed while the claim is settled
// (settledVM), as ttlTimer's.
func (s *State) archiveTimer(c *ClaimRec) (int64, bool) {
	if c.Status != ClaimHibernated {
		return 0, false
	}
	p := s.pools[c.Key]
	if p == nil || p.Spec.ArchiveAfterSeconds <= 0 {
		return 0, false
	}
	if _, ok := s.settledVM(c); !ok {
		return 0, false
	}
	return max(c.LastActivity+p.Spec.ArchiveAfterSeconds*second, c.ArchiveRetryAt), true
}

// expireArchives is the Tick's lease expiry of a claim whose expiry
// archives: a running claim hibernates (its archive follows once it is
// hibernated, the timer being due), a hibernated one archives; an
// unsettled one waits (its timer is re-armed once it settles). It reports
// false for a claim whose expiry ends it (an archived claim's retention
// included).
func (d *decider) expireArchives(c *ClaimRec) bool {
	v := d.s.vms[c.VM]
	if v == nil || v.Status == VMArchived || !d.s.archivesAtExpiry(c) {
		return false
	}
	if _, ok := d.s.settledVM(c); !ok {
		return true
	}
	switch c.Status {
	case ClaimRunning:
		d.closeRelays(c.ID, "expired")
		d.emit(event.HibernateRequested{Claim: c.ID, VM: c.VM, Reason: "expire"}, c.ID)
	case ClaimHibernated:
		d.emit(event.ArchiveRequested{Claim: c.ID, VM: c.VM, Reason: "expire"}, c.ID)
	}
	return true
}

// archiveDue is the Tick's pool archive timer of claim c: armed only while
// c is settled (archiveTimer), so it acts.
func (d *decider) archiveDue(c *ClaimRec) bool {
	if _, on := d.s.archiveTimer(c); !on {
		return false
	}
	d.emit(event.ArchiveRequested{Claim: c.ID, VM: c.VM, Reason: "idle"}, c.ID)
	return true
}

// --- apply ---------------------------------------------------------------------

// applyArchive folds the archive's events; ok is false for another event.
func (a *applier) applyArchive(p event.Payload) (ok bool, err error) {
	s, now := a.s, a.ev.Time
	switch p := p.(type) {
	case event.ArchiveRequested:
		c, err := a.claim(p.Claim, ClaimHibernated)
		if err != nil {
			return true, err
		}
		v, err := a.vm(c.VM, VMHibernated)
		if err != nil {
			return true, err
		}
		v.Op, v.ReqSeq = a.intentOp(), a.seq
		s.setVMStatus(v, VMArchiving)
		s.syncClaimTimers(c)

	case event.Archived:
		v, err := a.vm(p.VM, VMArchiving)
		if err != nil {
			return true, err
		}
		v.Op, v.Archive, v.SnapshotDir = event.ZeroOpID, p.Archive, ""
		s.setVMStatus(v, VMArchived)
		if c := a.claimIf(v, ClaimHibernated); c != nil {
			c.Deadline, c.ArchiveRetryAt = p.RetainUntilNS, 0
			s.syncClaimTimers(c)
		}

	case event.ArchiveFailed:
		v, err := a.vm(p.VM, VMArchiving)
		if err != nil {
			return true, err
		}
		v.Op = event.ZeroOpID
		s.setVMStatus(v, VMHibernated)
		if c := a.claimIf(v, ClaimHibernated); c != nil {
			c.ArchiveRetryAt = p.RetryAtNS
			s.syncClaimTimers(c)
		}

	case event.UnarchiveRequested:
		c, err := a.claim(p.Claim, ClaimHibernated)
		if err != nil {
			return true, err
		}
		v, err := a.vm(c.VM, VMArchived)
		if err != nil {
			return true, err
		}
		v.Op, v.ReqSeq = a.intentOp(), a.seq
		s.setVMStatus(v, VMUnarchiving)
		s.setClaimStatus(c, ClaimWaking, now)

	case event.Unarchived:
		v, err := a.vm(p.VM, VMUnarchiving)
		if err != nil {
			return true, err
		}
		v.Op, v.Archive, v.SnapshotDir = event.ZeroOpID, "", p.SnapshotDir
		s.setVMStatus(v, VMHibernated)
		if c := a.claimIf(v, ClaimWaking); c != nil {
			c.Deadline = p.DeadlineNS
			s.setClaimStatus(c, ClaimHibernated, now)
		}

	case event.UnarchiveFailed:
		v, err := a.vm(p.VM, VMUnarchiving)
		if err != nil {
			return true, err
		}
		v.Op = event.ZeroOpID
		s.setVMStatus(v, VMArchived)
		if c := a.claimIf(v, ClaimWaking); c != nil {
			s.setClaimStatus(c, ClaimHibernated, now)
		}

	default:
		return false, nil
	}
	return true, nil
}

// --- encoding (StateFormatV7) --------------------------------------------------

func (e *encoder) archive(s *State) {
	var pools []PoolKey
	for _, k := range sortedPoolKeys(s.pools) {
		if sp := s.pools[k].Spec; sp.ArchiveAfterSeconds != 0 || sp.ArchiveDeleteAfterSeconds != 0 {
			pools = append(pools, k)
		}
	}
	e.u(uint64(len(pools)))
	for _, k := range pools {
		sp := s.pools[k].Spec
		e.key(k)
		e.i(sp.ArchiveAfterSeconds)
		e.i(sp.ArchiveDeleteAfterSeconds)
	}
	vms := e.vmsWhere(s, func(v *VMRec) bool { return v.Archive != "" })
	e.u(uint64(len(vms)))
	for _, id := range vms {
		e.str(id)
		e.str(s.vms[id].Archive)
	}
	claims := e.claimsWhere(s, func(c *ClaimRec) bool { return c.OnExpireArchive || c.ArchiveRetryAt != 0 })
	e.u(uint64(len(claims)))
	for _, id := range claims {
		c := s.claims[id]
		e.str(id)
		e.bool(c.OnExpireArchive)
		e.i(c.ArchiveRetryAt)
	}
}

func (d *sdec) archive(s *State) {
	for range d.count() {
		k := d.key()
		after, del := d.i(), d.i()
		p := s.pools[k]
		d.check(p != nil, "archive settings of pool %s", k)
		if p != nil {
			p.Spec.ArchiveAfterSeconds, p.Spec.ArchiveDeleteAfterSeconds = after, del
		}
	}
	for range d.count() {
		id := d.str()
		name := d.str()
		v := s.vms[id]
		d.check(v != nil && name != "", "archive of VM %s", id)
		if v != nil {
			v.Archive = name
		}
	}
	for range d.count() {
		id := d.str()
		c := s.claims[id]
		d.check(c != nil, "archive fields of claim %s", id)
		if c == nil {
			c = &ClaimRec{}
		}
		c.OnExpireArchive = d.bool()
		c.ArchiveRetryAt = d.i()
	}
}
