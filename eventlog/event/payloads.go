package event

import (
	"cmp"
	"fmt"
	"strings"
)

// Payload structs, one per Type, registered for JSON decoding below. They are
// facts: each says what happened, with every value the state machine needs to
// fold it in, so that replaying the log never consults anything outside it.
//
// Conventions, all pinned by testdata/payloads/*.json:
//   - JSON field names are snake_case and never change meaning; a new field is
//     optional (omitempty) so older readers of a newer record do not break and
//     newer readers of an older record see the zero value.
//   - Times are unix nanoseconds (int64) with an _ns suffix.
//   - No secrets: a sandbox token is derived from (node secret, claim id,
//     token_gen) and only the generation is recorded; a tenant token is
//     recorded as its SHA-256 only.
//   - Slices are written in a deterministic order (sorted by the proposer) so
//     that the same decision always encodes to the same bytes.

// PoolKey identifies a pool and its golden snapshot.
type PoolKey struct {
	Template string `json:"template"`
	Net      string `json:"net"`
	Size     string `json:"size"`
}

// String returns "template/net/size", the key's form in aggregate ids and the
// API. Net and size never contain '/', so ParsePoolKey splits from the right.
func (k PoolKey) String() string { return k.Template + "/" + k.Net + "/" + k.Size }

// Compare orders keys by template, net, size.
func (k PoolKey) Compare(o PoolKey) int {
	if c := cmp.Compare(k.Template, o.Template); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Net, o.Net); c != 0 {
		return c
	}
	return cmp.Compare(k.Size, o.Size)
}

// ParsePoolKey parses the String form. It checks shape only; the state
// machine validates template names, nets and sizes.
func ParsePoolKey(s string) (PoolKey, error) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return PoolKey{}, fmt.Errorf("pool key %q: want template/net/size", s)
	}
	j := strings.LastIndexByte(s[:i], '/')
	if j <= 0 || i == len(s)-1 || j == i-1 {
		return PoolKey{}, fmt.Errorf("pool key %q: want template/net/size", s)
	}
	return PoolKey{Template: s[:j], Net: s[j+1 : i], Size: s[i+1:]}, nil
}

// PoolSpec is one pool's configuration (the body of PUT /v1/pools, per pool).
type PoolSpec struct {
	PoolKey
	// Warm is the refill target: warm VMs plus refill clones in flight.
	Warm int `json:"warm"`
	// WarmMax caps warm VMs plus refill clones; above it the oldest warm VMs
	// are trimmed. Normalised to at least Warm.
	WarmMax int `json:"warm_max"`
	// IdleHibernateSeconds hibernates a running claim after that long
	// without activity; 0 disables.
	IdleHibernateSeconds int64 `json:"idle_hibernate_seconds"`
	// ArchiveAfterSeconds (v2) archives a hibernated claim that long after
	// its last activity; 0 disables. ArchiveDeleteAfterSeconds is how long
	// an archive is kept; 0 keeps it until the claim is released.
	ArchiveAfterSeconds       int64 `json:"archive_after_seconds,omitempty"`
	ArchiveDeleteAfterSeconds int64 `json:"archive_delete_after_seconds,omitempty"`
}

// Key returns the spec's pool key.
func (p PoolSpec) Key() PoolKey { return p.PoolKey }

// ExecReport is what an executor measured while performing a side effect.
type ExecReport struct {
	Steps []Step `json:"steps,omitempty"`
	// CopyMode says how disk images were duplicated: "reflink" or "copy".
	CopyMode string `json:"copy_mode,omitempty"`
}

// Step is one named step of a recipe and its duration.
type Step struct {
	Name string `json:"name"`
	NS   int64  `json:"ns"`
}

// TenantCap is one tenant's live-claim cap.
type TenantCap struct {
	Tenant string `json:"tenant"`
	Cap    int    `json:"cap"`
}

// NodeConfigured records the node id and the instance id that owns the VMs
// this log creates (the instance id is part of every run dir).
type NodeConfigured struct {
	Node     string `json:"node"`
	Instance string `json:"instance"`
}

// PoolsConfigured is the complete set of active pools, sorted by key. Active
// pools missing from it start draining.
type PoolsConfigured struct {
	Pools []PoolSpec `json:"pools"`
}

// LimitsConfigured sets claim limits; 0 means unlimited. TenantCaps is
// sorted by tenant and overrides DefaultTenantCap.
type LimitsConfigured struct {
	MaxClaims        int         `json:"max_claims"`
	DefaultTenantCap int         `json:"default_tenant_cap"`
	TenantCaps       []TenantCap `json:"tenant_caps,omitempty"`
}

// GoldenBuildRequested asks for the golden snapshot of Key to be built.
// Reason is "new" or "retry".
type GoldenBuildRequested struct {
	Key    PoolKey `json:"key"`
	Reason string  `json:"reason"`
}

// GoldenBuilt: the golden of Key is ready in SnapshotDir.
type GoldenBuilt struct {
	Key         PoolKey     `json:"key"`
	SnapshotDir string      `json:"snapshot_dir"`
	Report      *ExecReport `json:"report,omitempty"`
}

// GoldenFailed: the build failed; it is retried at RetryAtNS.
type GoldenFailed struct {
	Key       PoolKey `json:"key"`
	Error     string  `json:"error"`
	RetryAtNS int64   `json:"retry_at_ns"`
}

// VMCloneRequested creates a VM record and asks for it to be cloned from its
// pool's golden, or cold booted from the template when Cold. Claim is set for
// an on-demand clone serving a pending claim and empty for a refill. RunDir is
// relative to the runs root and starts with the instance id.
type VMCloneRequested struct {
	VM       string  `json:"vm"`
	Key      PoolKey `json:"key"`
	Node     string  `json:"node"`
	Instance string  `json:"instance"`
	RunDir   string  `json:"run_dir"`
	Claim    string  `json:"claim,omitempty"`
	Cold     bool    `json:"cold,omitempty"`
	// Checkpoint names the checkpoint the VM is cloned from instead of its
	// pool's golden (a claim from a checkpoint, a fork's child).
	Checkpoint string `json:"checkpoint,omitempty"`
}

// VMCloned: the VM is running (restored and ready, or cold booted).
type VMCloned struct {
	VM     string      `json:"vm"`
	Report *ExecReport `json:"report,omitempty"`
}

// VMCloneFailed: the clone failed and the executor removed what it made.
type VMCloneFailed struct {
	VM    string `json:"vm"`
	Error string `json:"error"`
}

// VMDestroyRequested asks for the VM (and its snapshot, if hibernated) to be
// destroyed. Reason: drain, trim, release, expire, claim_ended, exited, failed.
type VMDestroyRequested struct {
	VM     string `json:"vm"`
	Reason string `json:"reason"`
}

// VMDestroyed: the VMM is gone and its run dir and snapshot removed.
type VMDestroyed struct {
	VM     string      `json:"vm"`
	Report *ExecReport `json:"report,omitempty"`
}

// VMExited: the VM's VMM process died without being asked to.
type VMExited struct {
	VM     string `json:"vm"`
	Detail string `json:"detail,omitempty"`
}

// VMRestartRequested asks for a claimed VM whose VMM died to be booted again,
// cold, from its own disk (its memory is lost; its claim keeps running).
// Attempt counts the restarts within the policy's window, this one
// included. Reason: exited.
type VMRestartRequested struct {
	VM      string `json:"vm"`
	Claim   string `json:"claim"`
	Reason  string `json:"reason"`
	Attempt int    `json:"attempt"`
}

// VMRestarted: the restarted VM runs and answers its readiness probe.
type VMRestarted struct {
	VM     string      `json:"vm"`
	Report *ExecReport `json:"report,omitempty"`
}

// VMRestartFailed: the cold restart failed; the claim fails and the VM is
// destroyed.
type VMRestartFailed struct {
	VM    string `json:"vm"`
	Error string `json:"error"`
}

// ClaimCreated records a claim. Tier "warm" took VM from the warm pool and the
// claim runs at once; "clone" and "cold" leave the claim pending until VM, an
// on-demand clone (or cold boot) requested in the same batch, is ready or
// ServeByNS passes.
//
// Version 2 adds the claim's egress, pinned for its life: EgressClass (the
// tenant's class when the claim was made), NoEgress (the claim asked for
// none), PolicyLayer ("pooled": the key had a configured pool; "unpooled":
// it had none; a v1 record, without it, reads as pooled) and Env (the
// claim's env, each value sealed).
type ClaimCreated struct {
	Claim       string            `json:"claim"`
	Key         PoolKey           `json:"key"`
	VM          string            `json:"vm"`
	Tier        string            `json:"tier"`
	Tenant      string            `json:"tenant,omitempty"`
	ClaimRef    string            `json:"claim_ref,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	TTLSeconds  int64             `json:"ttl_seconds"`
	DeadlineNS  int64             `json:"deadline_ns"`
	ServeByNS   int64             `json:"serve_by_ns"`
	TokenGen    uint32            `json:"token_gen"`
	EgressClass string            `json:"egress_class,omitempty"`
	NoEgress    bool              `json:"no_egress,omitempty"`
	PolicyLayer string            `json:"policy_layer,omitempty"`
	Env         []EnvEntry        `json:"env,omitempty"`
	// FromCheckpoint: the claim is branched from that checkpoint; Fork:
	// it is a child of the fork whose source checkpoint that is (its
	// siblings live or fail with it). Both optional.
	FromCheckpoint string `json:"from_checkpoint,omitempty"`
	Fork           string `json:"fork,omitempty"`
	// Volumes are the claim's volumes (volumes.go), attached once it runs.
	Volumes []ClaimVolume `json:"volumes,omitempty"`
	// OnExpire (v3) is the action at the lease's end: OnExpireArchive, or
	// empty for a destroy.
	OnExpire string `json:"on_expire,omitempty"`
}

// ClaimServed: a pending claim's VM is ready; the claim runs.
type ClaimServed struct {
	Claim string `json:"claim"`
	VM    string `json:"vm"`
}

// ClaimFailed ends a claim that cannot run. Reason: deadline (not served in
// time), clone_failed, cold_boot_failed, vm_exited, hibernate_failed,
// wake_failed, restart_failed.
type ClaimFailed struct {
	Claim  string `json:"claim"`
	VM     string `json:"vm"`
	Reason string `json:"reason"`
	Error  string `json:"error,omitempty"`
}

// ClaimRenewed moves the claim's deadline to now + TTLSeconds.
type ClaimRenewed struct {
	Claim      string `json:"claim"`
	TTLSeconds int64  `json:"ttl_seconds"`
	DeadlineNS int64  `json:"deadline_ns"`
	// OnExpire (v2), when set, switches the action at the lease's end:
	// OnExpireArchive or OnExpireDestroy; empty keeps it.
	OnExpire string `json:"on_expire,omitempty"`
}

// ClaimTouched records activity on a running claim (it resets the idle timer).
type ClaimTouched struct {
	Claim string `json:"claim"`
}

// ClaimReleased ends a claim on its owner's request.
type ClaimReleased struct {
	Claim string `json:"claim"`
	VM    string `json:"vm"`
}

// ClaimExpired ends a claim whose deadline passed (reap).
type ClaimExpired struct {
	Claim string `json:"claim"`
	VM    string `json:"vm"`
}

// HibernateRequested asks for the claim's VM to be hibernated. Reason: user
// or idle.
type HibernateRequested struct {
	Claim  string `json:"claim"`
	VM     string `json:"vm"`
	Reason string `json:"reason"`
}

// Hibernated: the VM's snapshot is durable in SnapshotDir and its VMM stopped.
type Hibernated struct {
	Claim       string      `json:"claim"`
	VM          string      `json:"vm"`
	SnapshotDir string      `json:"snapshot_dir"`
	Report      *ExecReport `json:"report,omitempty"`
}

// HibernateFailed: the hibernate was rolled back and the VM runs again, or,
// when Lost, the VM could not be recovered.
type HibernateFailed struct {
	Claim string `json:"claim"`
	VM    string `json:"vm"`
	Error string `json:"error"`
	Lost  bool   `json:"lost,omitempty"`
}

// WakeRequested asks for the VM to be restored from SnapshotDir.
type WakeRequested struct {
	Claim       string `json:"claim"`
	VM          string `json:"vm"`
	SnapshotDir string `json:"snapshot_dir"`
}

// Woken: the VM runs again.
type Woken struct {
	Claim  string      `json:"claim"`
	VM     string      `json:"vm"`
	Report *ExecReport `json:"report,omitempty"`
}

// WakeFailed: the restore failed and the snapshot is intact (the claim stays
// hibernated), or, when Lost, the snapshot is unusable.
type WakeFailed struct {
	Claim string `json:"claim"`
	VM    string `json:"vm"`
	Error string `json:"error"`
	Lost  bool   `json:"lost,omitempty"`
}

// PoolParked stops refills of Key (of every pool when Key is nil) until
// UntilNS. Reason: capacity (ENOSPC or a full exchange; the pool reports
// at_capacity) or clone_failed (a back-off after a failed refill clone).
type PoolParked struct {
	Key     *PoolKey `json:"key,omitempty"`
	UntilNS int64    `json:"until_ns"`
	Reason  string   `json:"reason"`
}

// PoolUnparked lets refills of Key (every pool when nil) resume.
type PoolUnparked struct {
	Key *PoolKey `json:"key,omitempty"`
}

// TenantPut records a tenant created or changed, with its whole record:
// TokenSHA256 is the lowercase hex SHA-256 of its token (the token itself
// is never recorded), MaxClaims its cap on live claims (0: none of its
// own), EgressClass the egress class it names (empty: none). Config marks
// a change proposed from sandboxd's config file rather than the API; once
// the API has changed the set, the config's tenants no longer apply.
type TenantPut struct {
	Name        string `json:"name"`
	TokenSHA256 string `json:"token_sha256"`
	MaxClaims   int    `json:"max_claims,omitempty"`
	EgressClass string `json:"egress_class,omitempty"`
	Config      bool   `json:"config,omitempty"`
	// Origin, when set, marks a change adopted from another node's set
	// (fleet-wide tenants): the node and time of the change adopted, the
	// version every node compares.
	Origin *TenantOrigin `json:"origin,omitempty"`
}

// TenantOrigin is the change a fleet-wide tenant event was adopted from:
// the node that made it through its API and that node's event time.
type TenantOrigin struct {
	Node string `json:"node"`
	Time int64  `json:"time"`
}

// TenantRemoved records a tenant taken out of the set: its token stops
// authenticating; its live claims run on. Config and Origin as in
// TenantPut.
type TenantRemoved struct {
	Name   string        `json:"name"`
	Config bool          `json:"config,omitempty"`
	Origin *TenantOrigin `json:"origin,omitempty"`
}

// NodeDrained: the node refuses new claims, stops refilling and destroys
// its warm VMs (in the same batch); live claims run on.
type NodeDrained struct{}

// NodeUncordoned: the node takes claims and refills again.
type NodeUncordoned struct{}

// RelayOpened records a client connection spliced to a running claim's
// guest, identified by Relay ("rl_" + 16 hex digits, minted by the API).
// Kind: agent (the guest agent's wire protocol), port (the guest TCP port
// Port) or exec (a buffered exec). While a claim has an open relay its
// idle-hibernate timer is held; opening one is activity, unless Passive (an
// operator's relay, which holds the timer without counting as use).
type RelayOpened struct {
	Relay   string `json:"relay"`
	Claim   string `json:"claim"`
	Kind    string `json:"kind"`
	Port    int    `json:"port,omitempty"`
	Passive bool   `json:"passive,omitempty"`
}

// RelayClosed ends an open relay; closing the claim's last one restarts the
// idle timer from its last activity (the close itself counts, unless the
// relay was passive). Reason: client, guest, idle, error,
// shutdown, restart (open when sandboxd died: recorded by its next start),
// or what ended the claim's running: released, expired, hibernate,
// vm_exited, failed. BytesIn and BytesOut count client-to-guest and
// guest-to-client bytes, when the relay's process measured them.
type RelayClosed struct {
	Relay    string `json:"relay"`
	Claim    string `json:"claim"`
	Reason   string `json:"reason"`
	BytesIn  int64  `json:"bytes_in,omitempty"`
	BytesOut int64  `json:"bytes_out,omitempty"`
}

// NodeAggID is the aggregate id of node-level events; ParkAggID(nil) is the
// aggregate id of node-wide parking.
const NodeAggID = "node"

// ParkAggID returns the aggregate id of a PoolParked/PoolUnparked event.
func ParkAggID(k *PoolKey) string {
	if k == nil {
		return "*"
	}
	return k.String()
}

func (NodeConfigured) EventType() Type       { return TypeNodeConfigured }
func (PoolsConfigured) EventType() Type      { return TypePoolsConfigured }
func (LimitsConfigured) EventType() Type     { return TypeLimitsConfigured }
func (GoldenBuildRequested) EventType() Type { return TypeGoldenBuildRequested }
func (GoldenBuilt) EventType() Type          { return TypeGoldenBuilt }
func (GoldenFailed) EventType() Type         { return TypeGoldenFailed }
func (VMCloneRequested) EventType() Type     { return TypeVMCloneRequested }
func (VMCloned) EventType() Type             { return TypeVMCloned }
func (VMCloneFailed) EventType() Type        { return TypeVMCloneFailed }
func (VMDestroyRequested) EventType() Type   { return TypeVMDestroyRequested }
func (VMDestroyed) EventType() Type          { return TypeVMDestroyed }
func (VMExited) EventType() Type             { return TypeVMExited }
func (ClaimCreated) EventType() Type         { return TypeClaimCreated }
func (ClaimServed) EventType() Type          { return TypeClaimServed }
func (ClaimFailed) EventType() Type          { return TypeClaimFailed }
func (ClaimRenewed) EventType() Type         { return TypeClaimRenewed }
func (ClaimTouched) EventType() Type         { return TypeClaimTouched }
func (ClaimReleased) EventType() Type        { return TypeClaimReleased }
func (ClaimExpired) EventType() Type         { return TypeClaimExpired }
func (HibernateRequested) EventType() Type   { return TypeHibernateRequested }
func (Hibernated) EventType() Type           { return TypeHibernated }
func (HibernateFailed) EventType() Type      { return TypeHibernateFailed }
func (WakeRequested) EventType() Type        { return TypeWakeRequested }
func (Woken) EventType() Type                { return TypeWoken }
func (WakeFailed) EventType() Type           { return TypeWakeFailed }
func (PoolParked) EventType() Type           { return TypePoolParked }
func (PoolUnparked) EventType() Type         { return TypePoolUnparked }
func (VMRestartRequested) EventType() Type   { return TypeVMRestartRequested }
func (VMRestarted) EventType() Type          { return TypeVMRestarted }
func (VMRestartFailed) EventType() Type      { return TypeVMRestartFailed }
func (TenantPut) EventType() Type            { return TypeTenantPut }
func (TenantRemoved) EventType() Type        { return TypeTenantRemoved }
func (NodeDrained) EventType() Type          { return TypeNodeDrained }
func (NodeUncordoned) EventType() Type       { return TypeNodeUncordoned }
func (RelayOpened) EventType() Type          { return TypeRelayOpened }
func (RelayClosed) EventType() Type          { return TypeRelayClosed }

// Version 1 of every type. A new schema version adds a registerJSON line (or
// a custom decoder that upgrades the old shape) and keeps this one.
func init() {
	registerJSON[NodeConfigured](1)
	registerJSON[PoolsConfigured](1)
	registerJSON[PoolsConfigured](2)
	registerJSON[LimitsConfigured](1)
	registerJSON[GoldenBuildRequested](1)
	registerJSON[GoldenBuilt](1)
	registerJSON[GoldenFailed](1)
	registerJSON[VMCloneRequested](1)
	registerJSON[VMCloned](1)
	registerJSON[VMCloneFailed](1)
	registerJSON[VMDestroyRequested](1)
	registerJSON[VMDestroyed](1)
	registerJSON[VMExited](1)
	registerJSON[ClaimCreated](1)
	registerJSON[ClaimCreated](2)
	registerJSON[ClaimCreated](3)
	registerJSON[ClaimServed](1)
	registerJSON[ClaimFailed](1)
	registerJSON[ClaimRenewed](1)
	registerJSON[ClaimRenewed](2)
	registerJSON[ClaimTouched](1)
	registerJSON[ClaimReleased](1)
	registerJSON[ClaimExpired](1)
	registerJSON[HibernateRequested](1)
	registerJSON[Hibernated](1)
	registerJSON[HibernateFailed](1)
	registerJSON[WakeRequested](1)
	registerJSON[Woken](1)
	registerJSON[WakeFailed](1)
	registerJSON[PoolParked](1)
	registerJSON[PoolUnparked](1)
	registerJSON[VMRestartRequested](1)
	registerJSON[VMRestarted](1)
	registerJSON[VMRestartFailed](1)
	registerJSON[TenantPut](1)
	registerJSON[TenantRemoved](1)
	registerJSON[NodeDrained](1)
	registerJSON[NodeUncordoned](1)
	registerJSON[RelayOpened](1)
	registerJSON[RelayClosed](1)
}
