package fsm

import (
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// The snapshot store is state: every snapshot dir in it has an owner here,
// and a dir no owner references any more is removed by an intent, never
// found by listing the store.
//
//   - Owners. A golden (a configured or draining pool's, or a promoted
//     template's: GoldenRec.SnapshotDir), a VM's hibernate image (from its
//     snapshot until its wake commits, which drops it, its archive is done,
//     or its destroy; also while a checkpoint or promote copies it), and
//     a retired dir until it is collected. SnapshotRefs lists them all, one
//     function per owner kind (snapshotOwners).
//   - Mapping. A clone restored from a golden maps that golden's
//     memory-ranges copy-on-write for its VMM's whole life, so a VM records
//     the dir it maps (VMRec.Maps) from its clone request until its VMM is
//     gone (destroyed, failed clone, hibernated, restarted cold).
//   - Retirement. A golden whose pool record is gone (the pool drained and
//     its last VM and claim went) and that no template holds, the old
//     golden of a rebuilt pool or a re-promoted template, and a deleted
//     template's golden are retired: the dir leaves its owner and is kept
//     as a RetiredRec. Once no VM maps it, a CollectSnapshot intent removes
//     it from the store (SnapshotCollected drops the record). The intent's
//     op id derives from the op of the event that made it due, so a
//     restarted daemon recomputes it.
//
// All of it follows Apply; nothing here reads the store.

// SnapshotOwnerKind names what holds a snapshot dir.
type SnapshotOwnerKind string

// Owner kinds.
const (
	OwnerGolden    SnapshotOwnerKind = "golden"    // a pool key's golden (Owner: the key)
	OwnerTemplate  SnapshotOwnerKind = "template"  // a promoted template's golden (Owner: the key)
	OwnerHibernate SnapshotOwnerKind = "hibernate" // a VM's hibernate image (Owner: the VM)
	OwnerRetired   SnapshotOwnerKind = "retired"   // retired, mapped or collecting (Owner: what held it)
	// A checkpoint's snapshot (Owner: the checkpoint id), until its own
	// removal intent (checkpoint_delete) takes it away.
	OwnerCheckpoint SnapshotOwnerKind = "checkpoint"
)

// SnapshotRef is one snapshot dir the state references, relative to the
// store, with its owner.
type SnapshotRef struct {
	Dir   string
	Kind  SnapshotOwnerKind
	Owner string
}

// snapshotOwners lists, per owner kind, the snapshot dirs the state
// references. A new kind of record owning snapshots is one line here.
var snapshotOwners = []func(s *State, add func(SnapshotRef)){
	goldenSnapshots,
	hibernateSnapshots,
	retiredSnapshots,
	checkpointSnapshots,
}

// SnapshotRefs returns every snapshot dir the state references, sorted by
// dir: what the store must hold (the start-up sweep keeps exactly these
// and in-flight intents' dirs). It costs O(goldens + VMs + retired).
func (s *State) SnapshotRefs() []SnapshotRef {
	var out []SnapshotRef
	add := func(r SnapshotRef) {
		if r.Dir != "" {
			out = append(out, r)
		}
	}
	for _, f := range snapshotOwners {
		f(s, add)
	}
	slices.SortFunc(out, func(a, b SnapshotRef) int {
		if a.Dir != b.Dir {
			if a.Dir < b.Dir {
				return -1
			}
			return 1
		}
		return 0
	})
	return out
}

func goldenSnapshots(s *State, add func(SnapshotRef)) {
	for _, k := range sortedPoolKeys(s.goldens) {
		kind := OwnerGolden
		if s.templates[k] != nil {
			kind = OwnerTemplate
		}
		add(SnapshotRef{Dir: s.goldens[k].SnapshotDir, Kind: kind, Owner: k.String()})
	}
}

// hibernateSnapshots: a VM's hibernate image, while it is hibernated,
// waking or promoted from it. A woken VM's record still names the image its
// wake dropped once committed, and a destroy removes the image itself, so
// neither counts.
func hibernateSnapshots(s *State, add func(SnapshotRef)) {
	held := func(v *VMRec) bool {
		p := s.promotes[v.ID]
		// A VM being checkpointed or archived keeps its image until that
		// settles (a checkpoint of a hibernated VM copies it; an archive
		// removes it only once the archive is verified); a running VM
		// being checkpointed has none.
		copying := (v.Status == VMCheckpointing || v.Status == VMArchiving) && v.SnapshotDir != ""
		return v.Status == VMHibernated || v.Status == VMWaking || p != nil && p.Hibernated || copying
	}
	for _, id := range sortedKeysWhere(s.vms, held) {
		add(SnapshotRef{Dir: s.vms[id].SnapshotDir, Kind: OwnerHibernate, Owner: id})
	}
}

func retiredSnapshots(s *State, add func(SnapshotRef)) {
	for _, dir := range sortedKeys(s.retired) {
		add(SnapshotRef{Dir: dir, Kind: OwnerRetired, Owner: s.retired[dir].Owner})
	}
}

// RetiredRec is a snapshot dir no owner references: removed by a
// CollectSnapshot once no VM maps it.
type RetiredRec struct {
	Dir string
	// Owner says what held it (for logs): "golden <key>", "template <key>".
	Owner string
	// DueBy is the op of the event after which no VM mapped it (zero while
	// one does); Op, the collect intent's op, derives from it.
	DueBy  event.OpID
	Op     event.OpID
	ReqSeq uint64
}

// Retired returns the retired dirs, sorted (mapped ones and those being
// collected).
func (s *State) Retired() []RetiredRec {
	out := make([]RetiredRec, 0, len(s.retired))
	for _, dir := range sortedKeys(s.retired) {
		out = append(out, *s.retired[dir])
	}
	return out
}

// Mappers returns how many VMs map dir.
func (s *State) Mappers(dir string) int { return s.mapped[dir] }

// collectOp is the collect intent's op of dir, made due by the event op.
func collectOp(due event.OpID, dir string) event.OpID {
	return event.DeriveOpID(due, "collect/"+dir)
}

// retire takes dir from its owner (described by owner) and collects it
// once nothing maps it. A dir some other owner still references (a golden
// promoted from... itself is never the case, but a decoded older state may
// share) is left alone.
func (s *State) retire(dir, owner string) {
	if dir == "" || s.retired[dir] != nil || s.referenced(dir) {
		return
	}
	s.retired[dir] = &RetiredRec{Dir: dir, Owner: owner}
	s.syncCollect(dir)
}

// referenced reports whether an owner other than the retired set still
// holds dir. O(goldens), on retirement only.
func (s *State) referenced(dir string) bool {
	for _, g := range s.goldens { //fsm:unordered existence check
		if g.SnapshotDir == dir {
			return true
		}
	}
	return false
}

// syncCollect makes dir's collection due when it is retired and no VM maps
// it, stamped with the op of the event being applied.
func (s *State) syncCollect(dir string) {
	r := s.retired[dir]
	if r == nil || s.mapped[dir] > 0 || r.Op != event.ZeroOpID {
		return
	}
	r.DueBy, r.Op, r.ReqSeq = s.applyOp, collectOp(s.applyOp, dir), s.applySeq
	s.collectBy[r.DueBy] = append(s.collectBy[r.DueBy], dir)
}

// mapVM records that v's VMM maps dir (its golden's memory-ranges).
func (s *State) mapVM(v *VMRec, dir string) {
	s.unmapVM(v)
	if dir == "" {
		return
	}
	v.Maps = dir
	s.mapped[dir]++
}

// unmapVM records that v's VMM no longer maps anything; the dir it mapped
// may become due for collection.
func (s *State) unmapVM(v *VMRec) {
	dir := v.Maps
	if dir == "" {
		return
	}
	v.Maps = ""
	if n := s.mapped[dir] - 1; n > 0 {
		s.mapped[dir] = n
	} else {
		delete(s.mapped, dir)
	}
	s.syncCollect(dir)
}

// syncGoldenOwner retires the golden of k when nothing owns the key any
// more: no pool record (configured or draining) and no promoted template.
// A build in flight keeps its record until its result.
func (s *State) syncGoldenOwner(k PoolKey) {
	g := s.goldens[k]
	if g == nil || s.pools[k] != nil || s.templates[k] != nil || g.Status == GoldenBuilding {
		return
	}
	delete(s.goldens, k)
	s.timers.remove(poolTimer(tGolden, k))
	s.retire(g.SnapshotDir, "golden "+k.String())
}

// --- the collect intent ------------------------------------------------------

// CollectSnapshot: remove Dir (relative to the store) from the store; no
// state record references it and no VM maps it. Removing a dir that is not
// there succeeds.
type CollectSnapshot struct {
	OpID   event.OpID
	Dir    string
	Owner  string
	ReqSeq uint64
}

func (i CollectSnapshot) Kind() IntentKind             { return KindCollect }
func (i CollectSnapshot) IntentOp() event.OpID         { return i.OpID }
func (i CollectSnapshot) Subject() string              { return i.Dir }
func (i CollectSnapshot) order() (int, uint64, string) { return classCollect, i.ReqSeq, i.Dir }

func (i CollectSnapshot) Succeeded(m Meta, _ Outcome) Command {
	return SnapshotCollected{Meta: m, Dir: i.Dir}
}

// Failed is nil: a dir nothing references has nowhere else to go, so its
// removal is retried until it succeeds.
func (i CollectSnapshot) Failed(Meta, string, bool) Command { return nil }

func collectIntent(r *RetiredRec) Intent {
	return CollectSnapshot{OpID: r.Op, Dir: r.Dir, Owner: r.Owner, ReqSeq: r.ReqSeq}
}

// collectIntents appends the due collections (Intents).
func (s *State) collectIntents(out []Intent) []Intent {
	for _, r := range s.retired { //fsm:unordered sorted by the caller
		if r.Op != event.ZeroOpID {
			out = append(out, collectIntent(r))
		}
	}
	return out
}

// newCollectIntents appends the collections the batch's ops made due
// (NewIntents): O(batch + due).
func (s *State) newCollectIntents(evs []event.Event, out []Intent) []Intent {
	for i := range evs {
		op := evs[i].OpID
		if i > 0 && evs[i-1].OpID == op {
			continue
		}
		for _, dir := range s.collectBy[op] {
			if r := s.retired[dir]; r != nil && r.DueBy == op {
				out = append(out, collectIntent(r))
			}
		}
	}
	return out
}

// SnapshotCollected reports a retired dir removed from the store.
type SnapshotCollected struct {
	Meta
	Dir string
}

func (c SnapshotCollected) decide(d *decider) error {
	r := d.s.retired[c.Dir]
	if r == nil {
		return reject(NotFound, "no retired snapshot %s", c.Dir)
	}
	if r.Op == event.ZeroOpID || r.Op != d.m.Cause {
		return reject(InvalidTransition, "snapshot %s: stale result (cause %s, op %s)", c.Dir, d.m.Cause, r.Op)
	}
	d.emit(event.SnapshotCollected{Dir: c.Dir}, c.Dir)
	return nil
}

func (a *applier) snapshotCollected(p event.SnapshotCollected) error {
	s := a.s
	r := s.retired[p.Dir]
	if r == nil || r.Op == event.ZeroOpID {
		return inconsistent("snapshot %s is not being collected", p.Dir)
	}
	delete(s.retired, p.Dir)
	if dirs := slices.DeleteFunc(s.collectBy[r.DueBy], func(d string) bool { return d == p.Dir }); len(dirs) > 0 {
		s.collectBy[r.DueBy] = dirs
	} else {
		delete(s.collectBy, r.DueBy)
	}
	return nil
}

// freshDir checks a snapshot dir an executor reports as new: a retired one
// is being removed and cannot become an owner's again.
func (d *decider) freshDir(dir string) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	if d.s.retired[dir] != nil {
		return reject(Invalid, "snapshot dir %s is retired", dir)
	}
	return nil
}

// upgradeStore fills in, for a state decoded from a format before V6, what
// its events give today: the clones of a golden that were never hibernated
// or restarted map it (goldens never changed then), and a golden no pool
// record and no template holds is retired (its collection due by the zero
// op, as no event made it so). It runs after rebuild.
func (s *State) upgradeStore() {
	for _, id := range sortedKeys(s.vms) {
		v := s.vms[id]
		g := s.goldens[v.Key]
		if v.Cold || v.SnapshotDir != "" || len(v.Restarts) > 0 || v.Status == VMHibernated || v.Status == VMWaking ||
			g == nil || g.Status != GoldenReady {
			continue
		}
		s.mapVM(v, g.SnapshotDir)
	}
	for _, k := range sortedPoolKeys(s.goldens) {
		s.syncGoldenOwner(k)
	}
}

// --- encoding (StateFormatV6) ------------------------------------------------

// encodeStore writes the store's records: the VMs that map a dir, the
// retired dirs, the promoted templates and the promotes in flight.
func (e *encoder) store(s *State) {
	maps := e.vmsWhere(s, func(v *VMRec) bool { return v.Maps != "" })
	e.u(uint64(len(maps)))
	for _, id := range maps {
		e.str(id)
		e.str(s.vms[id].Maps)
	}
	dirs := sortedKeys(s.retired)
	e.u(uint64(len(dirs)))
	for _, dir := range dirs {
		r := s.retired[dir]
		e.str(r.Dir)
		e.str(r.Owner)
		e.op(r.DueBy)
		e.op(r.Op)
		e.u(r.ReqSeq)
	}
	keys := sortedPoolKeys(s.templates)
	e.u(uint64(len(keys)))
	for _, k := range keys {
		t := s.templates[k]
		e.key(k)
		e.str(t.Tenant)
		e.str(t.Digest)
		e.i(t.Created)
		labels := sortedKeys(t.Labels)
		e.u(uint64(len(labels)))
		for _, l := range labels {
			e.str(l)
			e.str(t.Labels[l])
		}
	}
	vms := sortedKeys(s.promotes)
	e.u(uint64(len(vms)))
	for _, id := range vms {
		p := s.promotes[id]
		e.str(p.VM)
		e.key(p.Target)
		e.str(p.Tenant)
		e.bool(p.Hibernated)
	}
}

// store reads what encoder.store wrote.
func (d *sdec) store(s *State) {
	for range d.count() {
		v := s.vms[d.str()]
		dir := d.str()
		d.check(v != nil && dir != "", "a mapping of an unknown VM")
		if d.err != nil {
			return
		}
		v.Maps = dir
	}
	for range d.count() {
		r := &RetiredRec{Dir: d.str(), Owner: d.str(), DueBy: d.op(), Op: d.op(), ReqSeq: d.u()}
		d.check(r.Dir != "" && s.retired[r.Dir] == nil, "retired snapshot %q", r.Dir)
		s.retired[r.Dir] = r
	}
	for range d.count() {
		t := &TemplateRec{Key: d.key(), Tenant: d.istr(), Digest: d.str(), Created: d.i()}
		if n := d.count(); n > 0 {
			t.Labels = make(map[string]string, n)
			for range n {
				k := d.str()
				t.Labels[k] = d.str()
			}
		}
		d.check(s.templates[t.Key] == nil, "template %s twice", t.Key)
		s.templates[t.Key] = t
	}
	for range d.count() {
		p := &PromoteRec{VM: d.str(), Target: d.key(), Tenant: d.istr(), Hibernated: d.bool()}
		d.check(s.promotes[p.VM] == nil, "promote of %s twice", p.VM)
		s.promotes[p.VM] = p
	}
}

// rebuildStore derives the store's indexes from the records.
func (s *State) rebuildStore() {
	for _, v := range s.vms { //fsm:unordered counters only
		if v.Maps != "" {
			s.mapped[v.Maps]++
		}
	}
	for dir, r := range s.retired { //fsm:unordered index lists are order-free sets
		if r.Op != event.ZeroOpID {
			s.collectBy[r.DueBy] = append(s.collectBy[r.DueBy], dir)
		}
	}
}

// checkStore verifies the store's records and indexes (Check).
func (s *State) checkStore(fail func(string, ...any)) {
	mapped := map[string]int{}
	for id, v := range s.vms { //fsm:unordered verification only
		if v.Maps != "" {
			mapped[v.Maps]++
		}
		if (v.Status == VMPromoting) != (s.promotes[id] != nil) {
			fail("VM %s (%s): promote record %v", id, v.Status, s.promotes[id] != nil)
		}
	}
	if len(mapped) != len(s.mapped) {
		fail("mapping index has %d dirs, records say %d", len(s.mapped), len(mapped))
	}
	for dir, n := range mapped { //fsm:unordered verification only
		if s.mapped[dir] != n {
			fail("dir %s: %d mappers indexed, records say %d", dir, s.mapped[dir], n)
		}
	}
	due := 0
	for dir, r := range s.retired { //fsm:unordered verification only
		if (r.Op == event.ZeroOpID) != (mapped[dir] > 0) {
			fail("retired %s: op %s with %d mappers", dir, r.Op, mapped[dir])
		}
		if r.Op != event.ZeroOpID {
			due++
			if !slices.Contains(s.collectBy[r.DueBy], dir) {
				fail("retired %s: not indexed under %s", dir, r.DueBy)
			}
		}
		if s.referenced(dir) {
			fail("retired %s is still a golden", dir)
		}
	}
	n := 0
	for _, dirs := range s.collectBy { //fsm:unordered counting
		n += len(dirs)
	}
	if n != due {
		fail("collect index has %d entries, %d retired dirs are due", n, due)
	}
	targets := map[PoolKey]string{}
	for id, p := range s.promotes { //fsm:unordered verification only
		if o, dup := targets[p.Target]; dup {
			fail("promotes of VMs %s and %s both into %s", o, id, p.Target)
		}
		targets[p.Target] = id
	}
	for k, t := range s.templates { //fsm:unordered verification only
		if g := s.goldens[k]; g == nil || t.Key != k {
			fail("template %s without its golden", k)
		}
	}
}
