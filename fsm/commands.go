package fsm

import (
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// Meta is what the caller stamps on every command.
type Meta struct {
	// Op is the command's op id (a ULID). Every event Decide returns carries
	// it; the log dedupes a retried command by it. Required.
	Op event.OpID
	// Cause is, for an executor result, the op id of the intent it answers
	// (Intent.OpID); it must match the entity's op in flight. Zero for
	// external commands.
	Cause event.OpID
	// Now is the time in unix nanoseconds. Required (> 0).
	Now int64
}

func (m Meta) meta() Meta { return m }

// Command is one of the command structs below, as a value or a pointer. The
// interface is sealed: each command carries its own decision (its decide
// method, in decide.go), so a new command is one struct and one method.
type Command interface {
	meta() Meta
	// decide checks the command against d's state and emits its events.
	decide(d *decider) error
}

// ConfigureNode records the node id and the instance id owning the VMs this
// log creates. It must come before any command that creates a VM.
type ConfigureNode struct {
	Meta
	Node     string
	Instance string
}

// ConfigurePools replaces the set of active pools (PUT /v1/pools). Pools left
// out drain: their warm VMs are destroyed, claimed ones are left alone.
// WarmMax 0 means Warm.
//
// Egress holds the pools' egress policies (each key one of Pools'; a pool
// left out, or nil, has none); a pool left out of Pools keeps its policy
// while it drains.
type ConfigurePools struct {
	Meta
	Pools  []PoolSpec
	Egress map[PoolKey]*egress.Policy
}

// ConfigureLimits sets max_claims and tenant caps (0 = unlimited). A
// tenant in the tenant table has its cap there (PutTenant, SetTenants);
// TenantCaps only cap names that are not.
type ConfigureLimits struct {
	Meta
	MaxClaims        int
	DefaultTenantCap int
	TenantCaps       map[string]int
}

// Claim asks for a sandbox (POST /v1/claim).
type Claim struct {
	Meta
	// ID is the new claim's id, "sb_" + 16 lowercase hex, minted by the caller.
	ID       string
	Key      PoolKey
	Tenant   string
	ClaimRef string
	Metadata map[string]string
	// TTLSeconds is the lease: 0 means DefaultTTLSeconds, at most MaxTTLSeconds.
	TTLSeconds int64
	// ServeTimeoutSeconds bounds a pending claim's wait for its VM (0 means
	// DefaultServeTimeoutSeconds); never beyond the deadline.
	ServeTimeoutSeconds int64
	// TokenGen is the sandbox token's generation (0 means 1).
	TokenGen uint32
	// NoEgress: the claim asks for no egress policy ("egress": false).
	NoEgress bool
	// Env is the claim's env, values sealed by the caller.
	Env []egress.EnvEntry
	// WarmOnly refuses the claim (TooMany, NoWarmMsg) rather than clone or
	// boot a VM when the pool has no warm VM as the claim is decided: a
	// node that can send the claim to a peer with warm capacity asks for
	// this, so two claims racing for its last warm VM do not end in a
	// clone here.
	WarmOnly bool
	// Checkpoint, when set, branches the claim from that checkpoint (POST
	// /v1/checkpoints/{id}/claim): its key replaces Key.
	Checkpoint string
	// Volumes are catalog volumes to attach once the claim runs
	// (volumes.go); VolumesAttachOnly: mount none of them.
	Volumes           []VolumeRequest
	VolumesAttachOnly bool
	// OnExpire is the action at the lease's end: "archive", or "destroy"
	// (or empty), the default.
	OnExpire string
}

// Refill requests clones to bring pool Key (every pool short of its target
// when Key is zero) up to its warm target, as RefillsNeeded reports, at most
// MaxRefillBatch per command.
type Refill struct {
	Meta
	Key PoolKey
}

// Hibernate asks for a running claim to be hibernated.
type Hibernate struct {
	Meta
	Claim string
}

// Wake asks for a hibernated claim to be woken.
type Wake struct {
	Meta
	Claim string
}

// Release ends a live claim and destroys its VM (once any side effect in
// flight on it settles); releasing an ended claim is a no-op.
type Release struct {
	Meta
	Claim string
}

// Renew sets a live claim's deadline to Now + TTLSeconds (0 = default).
type Renew struct {
	Meta
	Claim      string
	TTLSeconds int64
	// OnExpire, when set, switches the action at the lease's end
	// ("archive" or "destroy"); empty keeps it. An archived claim is
	// refused: its deadline is its archive's retention.
	OnExpire string
}

// Touch records activity on a running claim, postponing idle hibernation.
type Touch struct {
	Meta
	Claim string
}

// Tick fires every timer due at Now: pending claims past their serve
// deadline fail, expired leases are reaped, idle claims hibernate, failed
// goldens are retried, parked refills resume.
type Tick struct{ Meta }

// Executor results. Meta.Cause is the intent's op id.

// GoldenBuilt reports a golden build done.
type GoldenBuilt struct {
	Meta
	Key         PoolKey
	SnapshotDir string
	Report      *event.ExecReport
}

// GoldenFailed reports a golden build failed.
type GoldenFailed struct {
	Meta
	Key   PoolKey
	Error string
}

// VMCloned reports a clone (or cold boot) running and ready.
type VMCloned struct {
	Meta
	VM     string
	Report *event.ExecReport
}

// VMCloneFailed reports a clone (or cold boot) failed and rolled back.
type VMCloneFailed struct {
	Meta
	VM    string
	Error string
}

// HibernateDone reports a VM hibernated into SnapshotDir.
type HibernateDone struct {
	Meta
	VM          string
	SnapshotDir string
	Report      *event.ExecReport
}

// HibernateFailed reports a hibernate rolled back (VM running again) or,
// with Lost, a VM that could not be recovered.
type HibernateFailed struct {
	Meta
	VM    string
	Error string
	Lost  bool
}

// WakeDone reports a VM woken.
type WakeDone struct {
	Meta
	VM     string
	Report *event.ExecReport
}

// WakeFailed reports a wake that failed with the snapshot intact or, with
// Lost, an unusable snapshot.
type WakeFailed struct {
	Meta
	VM    string
	Error string
	Lost  bool
}

// VMDestroyed reports a VM destroyed.
type VMDestroyed struct {
	Meta
	VM     string
	Report *event.ExecReport
}

// VMExited reports a VMM process that died on its own (Cause is zero). A
// warm VM is destroyed (its pool refills). A claimed VM of a running claim
// is restarted cold from its own disk (VMRestartRequested) while Restart
// allows: fewer than Restart.Max restarts within the last
// Restart.WindowNS; otherwise its claim fails (reason vm_exited) and it is
// destroyed. The zero policy never restarts.
type VMExited struct {
	Meta
	VM      string
	Detail  string
	Restart RestartPolicy
}

// RestartPolicy bounds the cold restarts of a claimed VM whose VMM dies: at
// most Max (0..MaxRestartHistory) within any WindowNS. The proposer stamps
// it from its configuration, like the time; DefaultRestartPolicy is the
// daemon's default.
type RestartPolicy struct {
	Max      int
	WindowNS int64
}

// DefaultRestartPolicy is 3 restarts per 10 minutes.
var DefaultRestartPolicy = RestartPolicy{Max: 3, WindowNS: 600 * second}

// VMRestarted reports a restarted VM running and ready.
type VMRestarted struct {
	Meta
	VM     string
	Report *event.ExecReport
}

// VMRestartFailed reports a cold restart that failed (no VMM left running).
type VMRestartFailed struct {
	Meta
	VM    string
	Error string
}

// CapacityFull reports ENOSPC or a full exchange: refills of Key (of every
// pool when Key is nil) are parked for CapacityParkNS.
type CapacityFull struct {
	Meta
	Key *PoolKey
}
