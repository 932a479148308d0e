package fsm

import (
	"encoding/json"
	"maps"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Promoted templates (POST /v1/sandboxes/{id}/promote): a live sandbox's
// snapshot becomes the golden of a new pool key, (template, the sandbox's
// net, its size), claimed like any key without a pool: cloned from that
// golden, provisioned on demand. The template record holds the owner
// tenant, the content digest and labels; its golden record holds the
// snapshot (an OwnerTemplate dir of SnapshotRefs). Re-promoting a name
// replaces the golden (the old one is retired); deleting the template
// retires its golden unless a draining pool still holds the key. A key a
// configured pool has is refused: its golden belongs to the pool.
//
// A promote is a side effect on the sandbox's VM (status promoting, its
// claim unchanged): a running VM is snapshotted in a pause window and runs
// on; a hibernated one is promoted from its image without waking. The
// claim's other calls that need its VM (hibernate, wake) are refused
// meanwhile; a release destroys the VM once the promote settles.

// Bounds on templates' labels (the old daemon's: claim metadata rules, at
// most 16 pairs, at most 4 KiB as JSON).
const (
	MaxTemplateLabels     = 16
	MaxTemplateLabelsJSON = 4096
)

// TemplateRec is a promoted template's record; Labels are read-only.
type TemplateRec struct {
	Key     PoolKey
	Tenant  string // the promoting tenant; empty: root
	Digest  string // the snapshot's content digest ("sha256:...")
	Created int64
	Labels  map[string]string
}

// PromoteRec is a promote in flight: VM into Target, for Tenant; the VM
// was Hibernated (promoted from its image) or claimed and running.
type PromoteRec struct {
	VM         string
	Target     PoolKey
	Tenant     string
	Hibernated bool
}

// Template returns the promoted template of k.
func (s *State) Template(k PoolKey) (TemplateRec, bool) {
	t, ok := s.templates[k]
	if !ok {
		return TemplateRec{}, false
	}
	return *t, true
}

// Templates returns every promoted template, sorted by key.
func (s *State) Templates() []TemplateRec {
	out := make([]TemplateRec, 0, len(s.templates))
	for _, k := range sortedPoolKeys(s.templates) {
		out = append(out, *s.templates[k])
	}
	return out
}

// Promote asks for claim Claim's sandbox to become template Template
// (under its own net and size). Tenant is the caller's (empty: root),
// recorded as the template's owner; a template another tenant owns is not
// replaced.
type Promote struct {
	Meta
	Claim    string
	Template string
	Tenant   string
}

// PromoteDone reports a promote done: SnapshotDir is the template's golden.
type PromoteDone struct {
	Meta
	VM          string
	SnapshotDir string
	Digest      string
	Report      *event.ExecReport
}

// PromoteFailed reports a promote rolled back (the VM as it was) or, with
// Lost, a VM that died in it.
type PromoteFailed struct {
	Meta
	VM    string
	Error string
	Lost  bool
}

// DeleteTemplate removes the promoted template of Key. Tenant is the
// caller's: a tenant deletes only its own templates (others are NotFound),
// root (empty) any. A non-empty Digest must be the template's.
type DeleteTemplate struct {
	Meta
	Key    PoolKey
	Tenant string
	Digest string
}

// SetTemplateLabels replaces the labels of the promoted template of Key,
// with DeleteTemplate's ownership and digest rules.
type SetTemplateLabels struct {
	Meta
	Key    PoolKey
	Tenant string
	Digest string
	Labels map[string]string
}

// RebuildGolden rebuilds the golden of configured pool Key: the new one
// replaces it when built, and the old one is retired (collected once the
// VMs cloned from it are gone). Refills and clone-tier claims wait for the
// new golden meanwhile. Rebuilding a golden being built is a no-op.
type RebuildGolden struct {
	Meta
	Key PoolKey
}

func (c Promote) decide(d *decider) error {
	s := d.s
	cl := s.claims[c.Claim]
	if cl == nil || !cl.Status.Live() {
		return reject(NotFound, "no sandbox %s", c.Claim)
	}
	key := PoolKey{Template: c.Template, Net: cl.Key.Net, Size: cl.Key.Size}
	if err := ValidKey(key); err != nil {
		return err
	}
	if err := checkText("tenant", c.Tenant, MaxTenant); err != nil {
		return err
	}
	if cl.Key.Net == "egress" {
		return reject(InvalidTransition, "sandbox %s is on the egress lane: it cannot be promoted", c.Claim)
	}
	if p := s.pools[key]; p != nil && !p.Draining {
		return reject(InvalidTransition, "template %s: the key belongs to a configured pool", key)
	}
	if t := s.templates[key]; t != nil && !ownsTemplate(c.Tenant, t) {
		return reject(InvalidTransition, "template %s is owned by another tenant", key)
	}
	if vm, busy := s.promoteInto(key); busy {
		return reject(InvalidTransition, "template %s: a promote into it is in flight (VM %s)", key, vm)
	}
	if cl.Status != ClaimRunning && cl.Status != ClaimHibernated {
		return reject(InvalidTransition, "sandbox %s is %s, cannot promote now", c.Claim, cl.Status)
	}
	v, err := d.settled(cl)
	if err != nil {
		return err
	}
	d.emit(event.PromoteRequested{Claim: cl.ID, VM: v.ID, Key: key, Tenant: c.Tenant}, cl.ID)
	return nil
}

// promoteInto returns the VM of the promote in flight into k, if any. It
// scans the promotes in flight (a handful: each holds a VM in a snapshot)
// rather than keep a second index of them by target.
func (s *State) promoteInto(k PoolKey) (string, bool) {
	for vm, p := range s.promotes { //fsm:unordered at most one matches
		if p.Target == k {
			return vm, true
		}
	}
	return "", false
}

// ownsTemplate: root owns every template, a tenant its own.
func ownsTemplate(tenant string, t *TemplateRec) bool { return tenant == "" || tenant == t.Tenant }

func (c PromoteDone) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMPromoting)
	if err != nil {
		return err
	}
	if err := d.freshDir(c.SnapshotDir); err != nil {
		return err
	}
	if len(c.Digest) > 128 {
		return reject(Invalid, "digest over 128 bytes")
	}
	p := d.s.promotes[v.ID]
	d.emit(event.Promoted{Claim: v.Claim, VM: v.ID, Key: p.Target, SnapshotDir: c.SnapshotDir, Digest: c.Digest, Report: c.Report}, v.Claim)
	d.settleFailure(v, snapshotSource(p.Hibernated), false, "", "")
	return nil
}

func (c PromoteFailed) decide(d *decider) error {
	v, err := d.inFlight(c.VM, VMPromoting)
	if err != nil {
		return err
	}
	d.emit(event.PromoteFailed{Claim: v.Claim, VM: v.ID, Error: errText(c.Error), Lost: c.Lost}, v.Claim)
	d.settleFailure(v, snapshotSource(d.s.promotes[v.ID].Hibernated), c.Lost, "promote_failed", c.Error)
	return nil
}

// template returns the promoted template of k as caller tenant may change
// it: NotFound when there is none or another tenant owns it, a conflict
// when a configured pool has the key or a promote into it is in flight,
// PreconditionFailed when digest is set and not the template's.
func (d *decider) template(k PoolKey, tenant, digest string) (*TemplateRec, error) {
	s := d.s
	if err := ValidKey(k); err != nil {
		return nil, err
	}
	if p := s.pools[k]; p != nil && !p.Draining {
		return nil, reject(InvalidTransition, "template %s: the key belongs to a configured pool", k)
	}
	t := s.templates[k]
	if t == nil || !ownsTemplate(tenant, t) {
		return nil, reject(NotFound, "no template %s", k)
	}
	if _, busy := s.promoteInto(k); busy {
		return nil, reject(InvalidTransition, "template %s: a promote into it is in flight", k)
	}
	if digest != "" && digest != t.Digest {
		return nil, reject(PreconditionFailed, "template %s has digest %s, not %s", k, t.Digest, digest)
	}
	return t, nil
}

func (c DeleteTemplate) decide(d *decider) error {
	if _, err := d.template(c.Key, c.Tenant, c.Digest); err != nil {
		return err
	}
	d.emit(event.TemplateDeleted{Key: c.Key}, c.Key.String())
	return nil
}

func (c SetTemplateLabels) decide(d *decider) error {
	if len(c.Labels) > MaxTemplateLabels {
		return reject(Invalid, "%d labels, at most %d", len(c.Labels), MaxTemplateLabels)
	}
	if err := checkMetadata(c.Labels); err != nil {
		return err
	}
	if b, _ := json.Marshal(c.Labels); len(b) > MaxTemplateLabelsJSON {
		return reject(Invalid, "labels are %d bytes as JSON, at most %d", len(b), MaxTemplateLabelsJSON)
	}
	t, err := d.template(c.Key, c.Tenant, c.Digest)
	if err != nil {
		return err
	}
	if maps.Equal(t.Labels, c.Labels) {
		return nil
	}
	labels := maps.Clone(c.Labels)
	if len(labels) == 0 {
		labels = nil
	}
	d.emit(event.TemplateLabelsSet{Key: c.Key, Labels: labels}, c.Key.String())
	return nil
}

func (c RebuildGolden) decide(d *decider) error {
	s := d.s
	p := s.pools[c.Key]
	if p == nil || p.Draining {
		return reject(UnknownPool, "no pool %s", c.Key)
	}
	if s.templates[c.Key] != nil {
		return reject(InvalidTransition, "%s is a promoted template: promote it again to replace its golden", c.Key)
	}
	if g := s.goldens[c.Key]; g != nil && g.Status == GoldenBuilding {
		return nil
	}
	d.emit(event.GoldenBuildRequested{Key: c.Key, Reason: "rebuild"}, c.Key.String())
	return nil
}

// --- apply -------------------------------------------------------------------

func (a *applier) promoteRequested(p event.PromoteRequested) error {
	s := a.s
	c, err := a.claim(p.Claim, ClaimRunning, ClaimHibernated)
	if err != nil {
		return err
	}
	v, err := a.vm(c.VM, VMClaimed, VMHibernated)
	if err != nil {
		return err
	}
	if v.ID != p.VM {
		return inconsistent("promote of claim %s names VM %s, not its %s", p.Claim, p.VM, v.ID)
	}
	if _, busy := s.promoteInto(p.Key); busy {
		return inconsistent("promote into %s already in flight", p.Key)
	}
	s.promotes[v.ID] = &PromoteRec{VM: v.ID, Target: p.Key, Tenant: p.Tenant, Hibernated: v.Status == VMHibernated}
	v.Op, v.ReqSeq = a.intentOp(), a.seq
	s.setVMStatus(v, VMPromoting)
	return nil
}

// settlePromote ends v's promote: back to the status it came from.
func (a *applier) settlePromote(vm string) (*VMRec, *PromoteRec, error) {
	s := a.s
	v, err := a.vm(vm, VMPromoting)
	if err != nil {
		return nil, nil, err
	}
	pr := s.promotes[vm]
	if pr == nil {
		return nil, nil, inconsistent("VM %s promoting without a record", vm)
	}
	delete(s.promotes, vm)
	v.Op = event.ZeroOpID
	s.setVMStatus(v, claimVMStatus[snapshotSource(pr.Hibernated)])
	return v, pr, nil
}

func (a *applier) promoted(p event.Promoted) error {
	s := a.s
	_, pr, err := a.settlePromote(p.VM)
	if err != nil {
		return err
	}
	if pr.Target != p.Key {
		return inconsistent("promote of %s into %s reported as %s", p.VM, pr.Target, p.Key)
	}
	k := pr.Target
	g := s.goldens[k]
	if g == nil {
		g = &GoldenRec{Key: k}
		s.goldens[k] = g
	}
	old := g.SnapshotDir
	if g.Status == GoldenBuilding {
		delete(s.pendingGoldens, k)
	}
	g.Status, g.Op, g.SnapshotDir, g.Error, g.RetryAt = GoldenReady, event.ZeroOpID, p.SnapshotDir, "", 0
	s.templates[k] = &TemplateRec{Key: k, Tenant: pr.Tenant, Digest: p.Digest, Created: a.ev.Time}
	if old != p.SnapshotDir {
		s.retire(old, "template "+k.String())
	}
	s.syncGoldenTimer(k)
	s.syncRefill(k)
	return nil
}

func (a *applier) promoteFailed(p event.PromoteFailed) error {
	_, _, err := a.settlePromote(p.VM)
	return err
}

func (a *applier) templateDeleted(p event.TemplateDeleted) error {
	s := a.s
	if s.templates[p.Key] == nil {
		return inconsistent("no template %s", p.Key)
	}
	delete(s.templates, p.Key)
	s.syncGoldenOwner(p.Key)
	return nil
}

func (a *applier) templateLabelsSet(p event.TemplateLabelsSet) error {
	t := a.s.templates[p.Key]
	if t == nil {
		return inconsistent("no template %s", p.Key)
	}
	t.Labels = maps.Clone(p.Labels)
	if len(t.Labels) == 0 {
		t.Labels = nil
	}
	return nil
}

// --- the promote intent ------------------------------------------------------

// PromoteVM: snapshot VM into a new snapshot dir of the store, the golden
// of Target. A running VM (SnapshotDir empty) is paused for the snapshot
// and resumed; a hibernated one is promoted from its image SnapshotDir
// without waking. RunDir is relative to the runs root and led by Instance.
type PromoteVM struct {
	OpID        event.OpID
	Claim       string
	VM          string
	Key         PoolKey
	Target      PoolKey
	Instance    string
	RunDir      string
	SnapshotDir string
	ReqSeq      uint64
}

func (i PromoteVM) Kind() IntentKind             { return KindPromote }
func (i PromoteVM) IntentOp() event.OpID         { return i.OpID }
func (i PromoteVM) Subject() string              { return i.VM }
func (i PromoteVM) order() (int, uint64, string) { return classHibernate, i.ReqSeq, i.VM }

func (i PromoteVM) Succeeded(m Meta, out Outcome) Command {
	return PromoteDone{Meta: m, VM: i.VM, SnapshotDir: out.SnapshotDir, Digest: out.Digest, Report: &out.Report}
}

func (i PromoteVM) Failed(m Meta, msg string, lost bool) Command {
	return PromoteFailed{Meta: m, VM: i.VM, Error: msg, Lost: lost}
}

func promoteIntent(s *State, v *VMRec) Intent {
	in := PromoteVM{OpID: v.Op, Claim: v.Claim, VM: v.ID, Key: v.Key, Instance: v.Instance, RunDir: v.RunDir, ReqSeq: v.ReqSeq}
	if p := s.promotes[v.ID]; p != nil {
		in.Target = p.Target
		if p.Hibernated {
			in.SnapshotDir = v.SnapshotDir
		}
	}
	return in
}
