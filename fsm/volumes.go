package fsm

import (
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Volumes, as the old daemon had them: the node's catalog of host-side
// volumes (an operator-owned disk image holding a filesystem, configured in
// sandboxd's config; its name is the virtio serial the guest finds it by)
// and each claim's attachments. A claim asks for volumes when it is made
// (Claim.Volumes) or attaches and detaches read-only ones while it runs
// (AttachVolumes, DetachVolumes). Each attachment is a side effect of its
// own (AttachVolume and DetachVolume intents: a hot-plugged disk, mounted by
// the guest agent where the claim asked), keyed by an op id derived from
// its request event and the volume's name.
//
// A volume is never attached read-write to two claims at once: a writer
// excludes every other claim of the name, readers exclude a writer (409).
// The hold lasts until the claim's VM is gone, not only until the claim
// ends, since a VM being destroyed still has the disk open. A claim's
// attached volumes go with it through hibernate, wake and restart (the
// intents name them); while a volume operation is in flight the claim does
// not hibernate (a snapshot never races a hot-plug). Ending the claim does
// not wait for it: the VM is destroyed at once, and an attach or detach
// still running on it fails against a VMM that is going away, its result
// refused as stale once the VM is gone.

// VolumeSpec is one catalog entry.
type VolumeSpec = event.VolumeSpec

// Volume bounds and the guest's conventions (the old daemon's).
const (
	// MaxClaimVolumes bounds a claim's volumes.
	MaxClaimVolumes = 8
	// MaxVolumes bounds the catalog.
	MaxVolumes = 256
	// MaxVolumePath bounds a backing file's path.
	MaxVolumePath = 1024
	// DefaultVolumeMountDir is where a volume is mounted when the claim
	// names no mount: /volumes/<name>.
	DefaultVolumeMountDir = "/volumes/"
)

// volumeNameRe is the old daemon's grammar, which is a virtio-blk serial's:
// at most 20 bytes.
var volumeNameRe = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,19}$`)

// guestOSRoots are the guest trees a volume may not be mounted on or under.
var guestOSRoots = []string{"/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr", "/var"}

// ValidVolumeName reports whether name is a legal volume name (the disk's
// serial): a lowercase letter, then up to 19 of [a-z0-9_-], not starting
// "cocoon-" (the old system's reserved disks).
func ValidVolumeName(name string) bool {
	return volumeNameRe.MatchString(name) && !strings.HasPrefix(name, "cocoon-")
}

// VolumeRequest is one volume a claim (or a live attach) asks for: Mount
// "" means DefaultVolumeMountDir+name (or nothing, attach-only), Mode "ro"
// (or "") or "rw".
type VolumeRequest struct {
	Name  string
	Mount string
	Mode  string
}

// VolumeStatus is an attachment's state.
type VolumeStatus uint8

// Attachment statuses.
const (
	// VolumeWaiting: asked for at claim time, the claim is not running yet.
	VolumeWaiting VolumeStatus = iota + 1
	VolumeAttaching
	VolumeAttached
	VolumeDetaching
	numVolumeStatus
)

var volumeStatusNames = [...]string{"", "waiting", "attaching", "attached", "detaching"}

func (v VolumeStatus) String() string { return enumName(volumeStatusNames[:], int(v)) }

// ClaimVolume is one of a claim's volumes.
type ClaimVolume struct {
	Name string
	// Mount is the guest mount point; empty: attach only.
	Mount string
	RW    bool
	// Path is the backing file, as the catalog had it when granted.
	Path   string
	Status VolumeStatus
	// Live: attached to the running claim (not asked for at claim time).
	Live bool
	// Op is the op id of the attach or detach in flight; Req the intent op
	// of its request event (IntentOp), which NewIntents looks up.
	Op     event.OpID
	Req    event.OpID
	ReqSeq uint64
}

func (v *ClaimVolume) pending() bool {
	return v.Status == VolumeAttaching || v.Status == VolumeDetaching
}

// VolumeDisk is an attached volume as a driver needs it.
type VolumeDisk struct {
	Name  string
	Path  string
	Mount string
	RW    bool
}

func (v *ClaimVolume) disk() VolumeDisk {
	return VolumeDisk{Name: v.Name, Path: v.Path, Mount: v.Mount, RW: v.RW}
}

// volumeHold is one volume name's holders: a writer excludes every other
// holder.
type volumeHold struct {
	readers int
	writer  string
}

// Volume returns the catalog entry name.
func (s *State) Volume(name string) (VolumeSpec, bool) {
	v, ok := s.volumes[name]
	if !ok {
		return VolumeSpec{}, false
	}
	return *v, true
}

// Volumes returns the catalog, sorted by name.
func (s *State) Volumes() []VolumeSpec {
	out := make([]VolumeSpec, 0, len(s.volumes))
	for _, n := range sortedKeys(s.volumes) {
		out = append(out, *s.volumes[n])
	}
	return out
}

// VolumeHolders returns how many claims hold volume name and whether one
// of them holds it read-write.
func (s *State) VolumeHolders(name string) (n int, writer bool) {
	h := s.volHolds[name]
	if h.writer != "" {
		return 1, true
	}
	return h.readers, false
}

// VolumeAllowed reports whether tenant may use catalog entry v (root,
// tenant "", may use every entry).
func VolumeAllowed(v VolumeSpec, tenant string) bool {
	return tenant == "" || len(v.Tenants) == 0 || slices.Contains(v.Tenants, tenant)
}

// AttachedDisks returns c's attached volumes, in claim order.
func (c *ClaimRec) AttachedDisks() []VolumeDisk {
	var out []VolumeDisk
	for i := range c.Volumes {
		if c.Volumes[i].Status == VolumeAttached {
			out = append(out, c.Volumes[i].disk())
		}
	}
	return out
}

// VolumeOpInFlight reports whether an attach or detach of c runs.
func (c *ClaimRec) VolumeOpInFlight() bool {
	return slices.ContainsFunc(c.Volumes, func(v ClaimVolume) bool { return v.pending() })
}

// ValidVolumeRequests checks a claim's volumes (attachOnly: the caller
// mounts them, so no mount may be named) and returns them with modes
// normalized and mounts defaulted: at most MaxClaimVolumes, names valid and
// unique, mounts absolute, clean, outside the guest OS tree, unique and not
// nested. The API checks a request with it before proposing.
func ValidVolumeRequests(in []VolumeRequest, attachOnly bool) ([]VolumeRequest, error) {
	if len(in) > MaxClaimVolumes {
		return nil, reject(Invalid, "invalid volume request: volumes must contain at most %d entries, got %d", MaxClaimVolumes, len(in))
	}
	if attachOnly && len(in) == 0 {
		return nil, reject(Invalid, "invalid volume request: volumes_attach_only requires at least one volume")
	}
	out := make([]VolumeRequest, len(in))
	for i, v := range in {
		if !ValidVolumeName(v.Name) {
			return nil, reject(Invalid, "invalid volume request: volumes[%d] name %q must match %s and not start with cocoon-", i, v.Name, volumeNameRe)
		}
		for j := range i {
			if out[j].Name == v.Name {
				return nil, reject(Invalid, "invalid volume request: volumes[%d] duplicates name %q", i, v.Name)
			}
		}
		switch v.Mode {
		case "", "ro":
			v.Mode = "ro"
		case "rw":
		default:
			return nil, reject(Invalid, "invalid volume request: volumes[%d] mode %q must be ro or rw", i, v.Mode)
		}
		if attachOnly {
			if v.Mount != "" {
				return nil, reject(Invalid, "invalid volume request: volumes[%d] mount %q is meaningless when the caller mounts the device itself", i, v.Mount)
			}
			out[i] = v
			continue
		}
		if v.Mount == "" {
			v.Mount = DefaultVolumeMountDir + v.Name
		}
		if err := validMount(v.Mount); err != nil {
			return nil, reject(Invalid, "invalid volume request: volumes[%d] mount %q %s", i, v.Mount, err.Msg)
		}
		out[i] = v
	}
	if err := checkMounts(out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkMounts refuses two volumes mounted on the same path or one inside
// the other (attach-only entries mount nothing).
func checkMounts(vs []VolumeRequest) error {
	for i, v := range vs {
		for j := range i {
			o := vs[j].Mount
			switch {
			case v.Mount == "" || o == "":
			case o == v.Mount:
				return reject(Invalid, "invalid volume request: volume %q mount %q duplicates volume %q's", v.Name, v.Mount, vs[j].Name)
			case within(o, v.Mount) || within(v.Mount, o):
				return reject(Invalid, "invalid volume request: volume %q mount %q nests with volume %q mount %q", v.Name, v.Mount, vs[j].Name, o)
			}
		}
	}
	return nil
}

func validMount(m string) *Rejection {
	switch {
	case len(m) > 256:
		return &Rejection{Code: Invalid, Msg: "is over 256 bytes"}
	case !strings.HasPrefix(m, "/"):
		return &Rejection{Code: Invalid, Msg: "must be absolute"}
	case path.Clean(m) != m:
		return &Rejection{Code: Invalid, Msg: "must be clean"}
	case m == "/" || slices.ContainsFunc(guestOSRoots, func(r string) bool { return m == r || within(r, m) }):
		return &Rejection{Code: Invalid, Msg: "must be outside the guest OS tree"}
	case strings.ContainsAny(m, "\x00\n\t ,"):
		return &Rejection{Code: Invalid, Msg: "must not contain spaces, tabs, newlines or commas"}
	}
	return nil
}

func within(parent, child string) bool { return strings.HasPrefix(child, parent+"/") }

// ValidVolumeSpecs checks a catalog (sandboxd's config): valid unique
// names, absolute clean unique paths, at most MaxVolumes.
func ValidVolumeSpecs(specs []VolumeSpec) error {
	if len(specs) > MaxVolumes {
		return reject(Invalid, "%d volumes, at most %d", len(specs), MaxVolumes)
	}
	names, paths := map[string]bool{}, map[string]string{}
	for _, v := range specs {
		if !ValidVolumeName(v.Name) {
			return reject(Invalid, "volume name %q must match %s and not start with cocoon-", v.Name, volumeNameRe)
		}
		if names[v.Name] {
			return reject(Invalid, "volume %q listed twice", v.Name)
		}
		names[v.Name] = true
		if !strings.HasPrefix(v.Path, "/") || path.Clean(v.Path) != v.Path || len(v.Path) > MaxVolumePath || strings.ContainsAny(v.Path, "\x00,") {
			return reject(Invalid, "volume %q: path %q must be absolute, clean, without commas and at most %d bytes", v.Name, v.Path, MaxVolumePath)
		}
		if o, dup := paths[v.Path]; dup {
			return reject(Invalid, "volume %q shares its path with volume %q", v.Name, o)
		}
		paths[v.Path] = v.Name
		for _, t := range v.Tenants {
			if err := checkText("volume tenant", t, MaxTenant); err != nil || t == "" {
				return reject(Invalid, "volume %q: bad tenant %q", v.Name, t)
			}
		}
	}
	return nil
}

// --- commands ----------------------------------------------------------------

// ConfigureVolumes replaces the volume catalog. Attached volumes stay
// attached (to the file they were granted) whatever the new catalog says.
type ConfigureVolumes struct {
	Meta
	Volumes []VolumeSpec
}

// AttachVolumes attaches read-only volumes to a running claim (POST
// /v1/sandboxes/{id}/volumes/attach). Volumes already attached with the
// same mount are no-ops.
type AttachVolumes struct {
	Meta
	Claim   string
	Volumes []VolumeRequest
}

// DetachVolumes unmounts and detaches a running claim's read-only
// volumes; names not attached are no-ops.
type DetachVolumes struct {
	Meta
	Claim string
	Names []string
}

// VolumeAttachDone reports an attach done (the result of AttachVolume).
type VolumeAttachDone struct {
	Meta
	Claim, VM, Volume string
}

// VolumeAttachError reports an attach failed and rolled back.
type VolumeAttachError struct {
	Meta
	Claim, VM, Volume, Error string
}

// VolumeDetachDone reports a detach done.
type VolumeDetachDone struct {
	Meta
	Claim, VM, Volume string
}

// VolumeDetachError reports a detach that failed; the volume stays.
type VolumeDetachError struct {
	Meta
	Claim, VM, Volume, Error string
}

func (c ConfigureVolumes) decide(d *decider) error {
	specs := slices.Clone(c.Volumes)
	slices.SortFunc(specs, func(a, b VolumeSpec) int { return strings.Compare(a.Name, b.Name) })
	for i := range specs {
		specs[i].Tenants = slices.Clone(specs[i].Tenants)
		slices.Sort(specs[i].Tenants)
		if len(specs[i].Tenants) == 0 {
			specs[i].Tenants = nil
		}
	}
	if err := ValidVolumeSpecs(specs); err != nil {
		return err
	}
	if slices.EqualFunc(specs, d.s.Volumes(), func(a, b VolumeSpec) bool {
		return a.Name == b.Name && a.Path == b.Path && a.Writable == b.Writable && slices.Equal(a.Tenants, b.Tenants)
	}) {
		return nil
	}
	d.emit(event.VolumesConfigured{Volumes: specs}, event.NodeAggID)
	return nil
}

// grantVolumes checks requests (already normalized) against the catalog
// and the holds for claim (of tenant; "" for a new claim, which holds
// nothing yet) and returns the volumes granted.
func (d *decider) grantVolumes(reqs []VolumeRequest, tenant string) ([]event.ClaimVolume, error) {
	out := make([]event.ClaimVolume, 0, len(reqs))
	for _, r := range reqs {
		v := d.s.volumes[r.Name]
		// Unknown and forbidden read the same, as the old daemon's.
		if v == nil || !VolumeAllowed(*v, tenant) {
			return nil, reject(Invalid, "invalid volume request: volume %q is unknown or not available", r.Name)
		}
		rw := r.Mode == "rw"
		if rw && !v.Writable {
			return nil, reject(Invalid, "invalid volume request: volume %q is not writable", r.Name)
		}
		h := d.s.volHolds[r.Name]
		if h.writer != "" || (rw && h.readers > 0) {
			return nil, reject(InvalidTransition, "volume busy: volume %q is attached read-write to another sandbox or read-only to others", r.Name)
		}
		out = append(out, event.ClaimVolume{Name: r.Name, Mount: r.Mount, RW: rw, Path: v.Path})
	}
	return out, nil
}

// claimVolumes is Claim's volume step: the granted volumes for its
// ClaimCreated.
func (c Claim) claimVolumes(d *decider) ([]event.ClaimVolume, error) {
	if len(c.Volumes) == 0 {
		if c.VolumesAttachOnly {
			return nil, reject(Invalid, "invalid volume request: volumes_attach_only requires at least one volume")
		}
		return nil, nil
	}
	reqs, err := ValidVolumeRequests(c.Volumes, c.VolumesAttachOnly)
	if err != nil {
		return nil, err
	}
	return d.grantVolumes(reqs, c.Tenant)
}

// runningForVolumes returns claim id if it runs, settled (settledVM).
func (d *decider) runningForVolumes(id string) (*ClaimRec, error) {
	c, err := d.liveClaim(id)
	if err != nil {
		return nil, err
	}
	if !c.Status.Live() {
		return nil, reject(NotFound, "no sandbox %s", id)
	}
	if c.Status != ClaimRunning {
		return nil, reject(InvalidTransition, "sandbox %s is %s: volumes change only while it runs", id, c.Status)
	}
	if _, err := d.settled(c); err != nil {
		return nil, err
	}
	return c, nil
}

func (cmd AttachVolumes) decide(d *decider) error {
	reqs, err := ValidVolumeRequests(cmd.Volumes, false)
	if err != nil {
		return err
	}
	for _, r := range reqs {
		if r.Mode == "rw" {
			return reject(Invalid, "invalid volume request: live attach requires read-only mounts")
		}
	}
	c, err := d.runningForVolumes(cmd.Claim)
	if err != nil {
		return err
	}
	var add []VolumeRequest
	mounts := make([]VolumeRequest, 0, len(c.Volumes)+len(reqs))
	for _, v := range c.Volumes {
		if v.Mount != "" {
			mounts = append(mounts, VolumeRequest{Name: v.Name, Mount: v.Mount, Mode: "ro"})
		}
	}
	for _, r := range reqs {
		i := slices.IndexFunc(c.Volumes, func(v ClaimVolume) bool { return v.Name == r.Name })
		if i >= 0 {
			if c.Volumes[i].Mount != r.Mount || c.Volumes[i].RW {
				return reject(Invalid, "invalid volume request: volume %q already has a different mount or mode", r.Name)
			}
			continue
		}
		add = append(add, r)
		mounts = append(mounts, r)
	}
	if len(c.Volumes)+len(add) > MaxClaimVolumes {
		return reject(Invalid, "invalid volume request: too many volumes (at most %d)", MaxClaimVolumes)
	}
	// The whole set's mounts must stay unique and unnested.
	if err := checkMounts(mounts); err != nil {
		return err
	}
	if len(add) == 0 {
		return nil
	}
	granted, err := d.grantVolumes(add, c.Tenant)
	if err != nil {
		return err
	}
	d.emit(event.VolumeAttachRequested{Claim: c.ID, VM: c.VM, Volumes: granted}, c.ID)
	return nil
}

func (cmd DetachVolumes) decide(d *decider) error {
	if len(cmd.Names) > MaxClaimVolumes {
		return reject(Invalid, "invalid volume request: too many volume names")
	}
	for i, n := range cmd.Names {
		if !ValidVolumeName(n) || slices.Contains(cmd.Names[:i], n) {
			return reject(Invalid, "invalid volume request: invalid or duplicate volume name %q", n)
		}
	}
	c, err := d.runningForVolumes(cmd.Claim)
	if err != nil {
		return err
	}
	var names []string
	for _, v := range c.Volumes {
		if !slices.Contains(cmd.Names, v.Name) {
			continue
		}
		if v.RW {
			return reject(Invalid, "invalid volume request: live detach of writable volumes is not supported")
		}
		names = append(names, v.Name)
	}
	if len(names) == 0 {
		return nil
	}
	d.emit(event.VolumeDetachRequested{Claim: c.ID, VM: c.VM, Volumes: names}, c.ID)
	return nil
}

// volumeInFlight returns the claim's volume name with the result's cause
// as its op in flight, in status want.
func (d *decider) volumeInFlight(claim, name string, want VolumeStatus) (*ClaimRec, *ClaimVolume, error) {
	c := d.s.claims[claim]
	if c == nil {
		return nil, nil, reject(NotFound, "no sandbox %s", claim)
	}
	i := slices.IndexFunc(c.Volumes, func(v ClaimVolume) bool { return v.Name == name })
	if i < 0 {
		return nil, nil, reject(InvalidTransition, "sandbox %s has no volume %s", claim, name)
	}
	v := &c.Volumes[i]
	if v.Status != want || v.Op != d.m.Cause {
		return nil, nil, reject(InvalidTransition, "volume %s of sandbox %s is %s under another operation (stale result)", name, claim, v.Status)
	}
	return c, v, nil
}

func (cmd VolumeAttachDone) decide(d *decider) error {
	c, v, err := d.volumeInFlight(cmd.Claim, cmd.Volume, VolumeAttaching)
	if err != nil {
		return err
	}
	d.emit(event.VolumeAttached{Claim: c.ID, VM: c.VM, Volume: v.Name}, c.ID)
	return nil
}

func (cmd VolumeAttachError) decide(d *decider) error {
	c, v, err := d.volumeInFlight(cmd.Claim, cmd.Volume, VolumeAttaching)
	if err != nil {
		return err
	}
	d.emit(event.VolumeAttachFailed{Claim: c.ID, VM: c.VM, Volume: v.Name, Error: errText(cmd.Error)}, c.ID)
	if !v.Live && c.Status == ClaimRunning {
		// A claim without the volumes it asked for fails, as the old
		// daemon's did (it released such a sandbox and answered 500).
		d.closeRelays(c.ID, "failed")
		d.emit(event.ClaimFailed{Claim: c.ID, VM: c.VM, Reason: "volume_failed", Error: errText("volume " + v.Name + ": " + cmd.Error)}, c.ID)
		d.destroySettled(c.VM, "failed")
	}
	return nil
}

func (cmd VolumeDetachDone) decide(d *decider) error {
	c, v, err := d.volumeInFlight(cmd.Claim, cmd.Volume, VolumeDetaching)
	if err != nil {
		return err
	}
	d.emit(event.VolumeDetached{Claim: c.ID, VM: c.VM, Volume: v.Name}, c.ID)
	return nil
}

func (cmd VolumeDetachError) decide(d *decider) error {
	c, v, err := d.volumeInFlight(cmd.Claim, cmd.Volume, VolumeDetaching)
	if err != nil {
		return err
	}
	d.emit(event.VolumeDetachFailed{Claim: c.ID, VM: c.VM, Volume: v.Name, Error: errText(cmd.Error)}, c.ID)
	return nil
}

// --- apply -------------------------------------------------------------------

func (a *applier) volumesConfigured(p event.VolumesConfigured) error {
	s := a.s
	s.volumes = make(map[string]*VolumeSpec, len(p.Volumes))
	for i := range p.Volumes {
		v := p.Volumes[i]
		if _, dup := s.volumes[v.Name]; dup || v.Name == "" {
			return inconsistent("volume %q listed twice", v.Name)
		}
		s.volumes[v.Name] = &v
	}
	return nil
}

// claimVolumesOf turns a claim's granted volumes into its records, waiting
// for the claim to run.
func claimVolumesOf(vs []event.ClaimVolume) []ClaimVolume {
	if len(vs) == 0 {
		return nil
	}
	out := make([]ClaimVolume, len(vs))
	for i, v := range vs {
		out[i] = ClaimVolume{Name: v.Name, Mount: v.Mount, RW: v.RW, Path: v.Path, Status: VolumeWaiting}
	}
	return out
}

// startVolumes requests the attaches of c's waiting volumes: c just began
// to run (its ClaimCreated of tier warm or its ClaimServed).
func (a *applier) startVolumes(c *ClaimRec) {
	if len(c.Volumes) == 0 {
		return
	}
	req := a.intentOp()
	vs := slices.Clone(c.Volumes)
	for i := range vs {
		if vs[i].Status == VolumeWaiting {
			vs[i].Status, vs[i].Req, vs[i].Op, vs[i].ReqSeq = VolumeAttaching, req, volumeOp(req, vs[i].Name), a.seq
		}
	}
	a.s.setClaimVolumes(c, vs)
}

// volumeOp is the intent op of volume name's attach or detach requested
// by the request event whose intent op is req: one event may request
// several.
func volumeOp(req event.OpID, name string) event.OpID { return event.DeriveOpID(req, "volume/"+name) }

func (a *applier) volumeAttachRequested(p event.VolumeAttachRequested) error {
	c, err := a.claim(p.Claim, ClaimRunning)
	if err != nil {
		return err
	}
	req := a.intentOp()
	vs := slices.Clone(c.Volumes)
	for _, v := range p.Volumes {
		if slices.ContainsFunc(vs, func(o ClaimVolume) bool { return o.Name == v.Name }) {
			return inconsistent("claim %s already has volume %s", c.ID, v.Name)
		}
		vs = append(vs, ClaimVolume{Name: v.Name, Mount: v.Mount, RW: v.RW, Path: v.Path, Status: VolumeAttaching, Live: true,
			Req: req, Op: volumeOp(req, v.Name), ReqSeq: a.seq})
	}
	a.s.setClaimVolumes(c, vs)
	return nil
}

func (a *applier) volumeDetachRequested(p event.VolumeDetachRequested) error {
	c, err := a.claim(p.Claim, ClaimRunning)
	if err != nil {
		return err
	}
	req := a.intentOp()
	vs := slices.Clone(c.Volumes)
	for _, n := range p.Volumes {
		i := slices.IndexFunc(vs, func(o ClaimVolume) bool { return o.Name == n })
		if i < 0 || vs[i].Status != VolumeAttached {
			return inconsistent("claim %s: volume %s is not attached", c.ID, n)
		}
		vs[i].Status, vs[i].Req, vs[i].Op, vs[i].ReqSeq = VolumeDetaching, req, volumeOp(req, n), a.seq
	}
	a.s.setClaimVolumes(c, vs)
	return nil
}

// volumeSettled applies a volume result: the entry becomes attached
// (keep) or goes.
func (a *applier) volumeSettled(claim, name string, from VolumeStatus, keep bool, to VolumeStatus) error {
	c := a.s.claims[claim]
	if c == nil {
		return inconsistent("no claim %s", claim)
	}
	i := slices.IndexFunc(c.Volumes, func(o ClaimVolume) bool { return o.Name == name })
	if i < 0 || c.Volumes[i].Status != from {
		return inconsistent("claim %s: volume %s is not %s", claim, name, from)
	}
	vs := slices.Clone(c.Volumes)
	if keep {
		vs[i].Status, vs[i].Op, vs[i].Req = to, event.ZeroOpID, event.ZeroOpID
	} else {
		vs = slices.Delete(vs, i, i+1)
	}
	a.s.setClaimVolumes(c, vs)
	return nil
}

// --- indexes -----------------------------------------------------------------

// setClaimVolumes replaces c's volumes with vs (a new slice: records
// handed out by Claim share the old one), keeping the holds and the
// pending-intent index in step.
func (s *State) setClaimVolumes(c *ClaimRec, vs []ClaimVolume) {
	if len(c.Volumes) == 0 && len(vs) == 0 {
		return // most claims: made and purged without volumes, nothing to index
	}
	s.indexVolumes(c, -1)
	if len(vs) == 0 {
		vs = nil
	}
	c.Volumes = vs
	s.indexVolumes(c, 1)
	// An archiving expiry's and the archive timer wait for a settled
	// claim (settledVM): a volume operation starting or ending changes it.
	s.syncClaimTimers(c)
}

// indexVolumes adds (d = 1) or removes (d = -1) c's volumes from the holds
// and the pending index.
func (s *State) indexVolumes(c *ClaimRec, d int) {
	for i := range c.Volumes {
		v := &c.Volumes[i]
		h := s.volHolds[v.Name]
		if v.RW {
			if d > 0 {
				h.writer = c.ID
			} else {
				h.writer = ""
			}
		} else {
			h.readers += d
		}
		if h.readers == 0 && h.writer == "" {
			delete(s.volHolds, v.Name)
		} else {
			s.volHolds[v.Name] = h
		}
	}
	if d > 0 && c.VolumeOpInFlight() {
		s.pendingVols[c.ID] = struct{}{}
	} else {
		delete(s.pendingVols, c.ID)
	}
}

// releaseVolumes drops the volumes of claim c once it ended and its VM is
// gone (a VM being destroyed still has its disks open).
func (s *State) releaseVolumes(c *ClaimRec) {
	if c == nil || len(c.Volumes) == 0 || c.Status.Live() {
		return
	}
	if v := s.vms[c.VM]; v != nil && v.Claim == c.ID {
		return
	}
	s.setClaimVolumes(c, nil)
}

// volumeIntents returns the volume intents of claim agg requested by the
// event whose intent op is req.
func (s *State) volumeIntents(agg string, req event.OpID) []Intent {
	c := s.claims[agg]
	if c == nil {
		return nil
	}
	var out []Intent
	for i := range c.Volumes {
		if v := &c.Volumes[i]; v.pending() && v.Req == req {
			out = append(out, s.volumeIntent(c, v))
		}
	}
	return out
}

func (s *State) volumeIntent(c *ClaimRec, v *ClaimVolume) Intent {
	vm := s.vms[c.VM]
	base := VolumeIntent{OpID: v.Op, Claim: c.ID, VM: c.VM, Key: c.Key, Disk: v.disk(), ReqSeq: v.ReqSeq}
	if vm != nil {
		base.Instance, base.RunDir = vm.Instance, vm.RunDir
	}
	if v.Status == VolumeDetaching {
		return DetachVolume{base}
	}
	return AttachVolume{base}
}

// pendingVolumeIntents lists every volume intent (Intents).
func (s *State) pendingVolumeIntents() []Intent {
	var out []Intent
	for id := range s.pendingVols { //fsm:unordered Intents sorts
		c := s.claims[id]
		if c == nil {
			continue
		}
		for i := range c.Volumes {
			if c.Volumes[i].pending() {
				out = append(out, s.volumeIntent(c, &c.Volumes[i]))
			}
		}
	}
	return out
}

// --- intents -----------------------------------------------------------------

// Volume intent kinds.
const (
	KindAttachVolume IntentKind = "volume_attach"
	KindDetachVolume IntentKind = "volume_detach"
)

// VolumeIntent is what both volume intents carry: the claim's VM (its run
// dir) and the volume.
type VolumeIntent struct {
	OpID     event.OpID
	Claim    string
	VM       string
	Key      PoolKey
	Instance string
	RunDir   string
	Disk     VolumeDisk
	ReqSeq   uint64
}

// AttachVolume: hot-plug Disk into the running VM (read-only unless RW,
// serial Disk.Name) and have the guest mount it at Disk.Mount (none when
// empty).
type AttachVolume struct{ VolumeIntent }

// DetachVolume: unmount Disk in the guest and unplug it.
type DetachVolume struct{ VolumeIntent }

func (i AttachVolume) Kind() IntentKind     { return KindAttachVolume }
func (i AttachVolume) IntentOp() event.OpID { return i.OpID }
func (i AttachVolume) Subject() string      { return i.VM + "/" + i.Disk.Name }

// A claim waits for its volumes: they rank with wakes.
func (i AttachVolume) order() (int, uint64, string) { return classWake, i.ReqSeq, i.Subject() }

func (i AttachVolume) Succeeded(m Meta, _ Outcome) Command {
	return VolumeAttachDone{Meta: m, Claim: i.Claim, VM: i.VM, Volume: i.Disk.Name}
}

func (i AttachVolume) Failed(m Meta, msg string, _ bool) Command {
	return VolumeAttachError{Meta: m, Claim: i.Claim, VM: i.VM, Volume: i.Disk.Name, Error: msg}
}

func (i DetachVolume) Kind() IntentKind             { return KindDetachVolume }
func (i DetachVolume) IntentOp() event.OpID         { return i.OpID }
func (i DetachVolume) Subject() string              { return i.VM + "/" + i.Disk.Name }
func (i DetachVolume) order() (int, uint64, string) { return classWake, i.ReqSeq, i.Subject() }
func (i DetachVolume) Succeeded(m Meta, _ Outcome) Command {
	return VolumeDetachDone{Meta: m, Claim: i.Claim, VM: i.VM, Volume: i.Disk.Name}
}

func (i DetachVolume) Failed(m Meta, msg string, _ bool) Command {
	return VolumeDetachError{Meta: m, Claim: i.Claim, VM: i.VM, Volume: i.Disk.Name, Error: msg}
}

// attachedDisks returns claim's attached volumes (nil for none or no claim).
func (s *State) attachedDisks(claim string) []VolumeDisk {
	if c := s.claims[claim]; c != nil {
		return c.AttachedDisks()
	}
	return nil
}

// --- encoding (the V6 section of Encode) -------------------------------------

func (e *encoder) volumes(s *State) {
	names := sortedKeys(s.volumes)
	e.u(uint64(len(names)))
	for _, n := range names {
		v := s.volumes[n]
		e.str(v.Name)
		e.str(v.Path)
		e.bool(v.Writable)
		e.u(uint64(len(v.Tenants)))
		for _, t := range v.Tenants {
			e.str(t)
		}
	}
	with := e.claimsWhere(s, func(c *ClaimRec) bool { return len(c.Volumes) > 0 })
	e.u(uint64(len(with)))
	for _, id := range with {
		c := s.claims[id]
		e.str(id)
		e.u(uint64(len(c.Volumes)))
		for _, v := range c.Volumes {
			e.str(v.Name)
			e.str(v.Mount)
			e.bool(v.RW)
			e.str(v.Path)
			e.u(uint64(v.Status))
			e.bool(v.Live)
			e.op(v.Op)
			e.op(v.Req)
			e.u(v.ReqSeq)
		}
	}
}

func (d *sdec) volumes(s *State) {
	n := d.count()
	for range n {
		v := &VolumeSpec{Name: d.str(), Path: d.str(), Writable: d.bool()}
		for range d.count() {
			v.Tenants = append(v.Tenants, d.str())
		}
		d.check(v.Name != "" && s.volumes[v.Name] == nil, "volume %q", v.Name)
		if d.err != nil {
			return
		}
		s.volumes[v.Name] = v
	}
	n = d.count()
	for range n {
		c := s.claims[d.claimID(s.claims)]
		k := d.count()
		vs := make([]ClaimVolume, 0, k)
		for range k {
			v := ClaimVolume{Name: d.str(), Mount: d.str(), RW: d.bool(), Path: d.str()}
			st := d.u()
			v.Live, v.Op, v.Req, v.ReqSeq = d.bool(), d.op(), d.op(), d.u()
			d.check(st >= uint64(VolumeWaiting) && st < uint64(numVolumeStatus), "volume %s status %d", v.Name, st)
			v.Status = VolumeStatus(st)
			vs = append(vs, v)
		}
		d.check(c != nil, "volumes of an unknown claim")
		if d.err != nil {
			return
		}
		s.setClaimVolumes(c, vs)
	}
}

// checkVolumes is Check's part for volumes: the holds and the pending
// index equal what the claims' volumes imply, a claim holds a volume name
// once, and a writer is the name's only holder.
func (s *State) checkVolumes(fail func(string, ...any)) {
	holds := map[string]volumeHold{}
	pending := map[string]bool{}
	for _, id := range sortedKeysWhere(s.claims, func(c *ClaimRec) bool { return len(c.Volumes) > 0 }) {
		c := s.claims[id]
		seen := map[string]bool{}
		for i := range c.Volumes {
			v := &c.Volumes[i]
			if seen[v.Name] {
				fail("claim %s holds volume %s twice", id, v.Name)
			}
			seen[v.Name] = true
			h := holds[v.Name]
			if v.RW {
				if h.writer != "" || h.readers > 0 {
					fail("volume %s: writer %s next to other holders", v.Name, id)
				}
				h.writer = id
			} else {
				if h.writer != "" {
					fail("volume %s: reader %s next to writer %s", v.Name, id, h.writer)
				}
				h.readers++
			}
			holds[v.Name] = h
			if v.pending() {
				pending[id] = true
			}
			if v.Status == VolumeWaiting && c.Status != ClaimPending && c.Status.Live() {
				fail("claim %s (%s): volume %s still waiting", id, c.Status, v.Name)
			}
		}
	}
	if len(holds) != len(s.volHolds) {
		fail("volume holds: %d names indexed, want %d", len(s.volHolds), len(holds))
	}
	for _, n := range sortedKeys(holds) {
		if s.volHolds[n] != holds[n] {
			fail("volume %s holds %+v, want %+v", n, s.volHolds[n], holds[n])
		}
	}
	if len(pending) != len(s.pendingVols) {
		fail("pending volume index: %d, want %d", len(s.pendingVols), len(pending))
	}
	for _, id := range sortedKeys(pending) {
		if _, ok := s.pendingVols[id]; !ok {
			fail("claim %s: volume op not in the pending index", id)
		}
	}
}
