package fsm

import (
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// PoolKey identifies a pool (template, net, size) and its golden.
type PoolKey = event.PoolKey

// PoolSpec is one pool's configuration.
type PoolSpec = event.PoolSpec

// Time constants of the old daemon's behaviour, in nanoseconds.
const (
	second = int64(1_000_000_000)

	// DefaultTTLSeconds is a claim's lease when the request says 0.
	DefaultTTLSeconds = 300
	// MaxTTLSeconds is the longest lease (24 h).
	MaxTTLSeconds = 86400
	// DefaultServeTimeoutSeconds bounds how long a pending (clone or cold)
	// claim may wait for its VM before it fails with reason "deadline".
	DefaultServeTimeoutSeconds = 60
	// GoldenRetryNS is how long after a failed build the golden is retried.
	GoldenRetryNS = 30 * second
	// CapacityParkNS is how long refills stay parked after the executors
	// report the node or a pool at capacity.
	CapacityParkNS = 30 * second
	// CloneRetryNS parks a pool's refills after a failed refill clone, so a
	// broken golden does not spin the executors.
	CloneRetryNS = 5 * second
	// ClaimRetentionNS is how long an ended claim stays in state (so a second
	// release still answers 204) before it is forgotten.
	ClaimRetentionNS = 3600 * second
)

// Bounds on inputs, so a client cannot grow the log or the state without
// bound. They match the HTTP API's own checks.
const (
	MaxPools = 256
	MaxWarm  = 10000
	// MaxTotalWarm bounds warm_max over all pools, which bounds the events
	// of one PUT pools (its drains and trims) well under an append's limit.
	MaxTotalWarm     = 100_000
	MaxIdleSeconds   = 30 * 86400
	MaxClaimRef      = 256
	MaxMetadataKeys  = 32
	MaxMetadataKey   = 64
	MaxMetadataValue = 1024
	MaxTenant        = 128
	MaxErrorText     = 4096
	MaxServeTimeout  = 3600
	// MaxRefillBatch bounds the clones one Refill requests; a pool still
	// short stays in RefillsNeeded for the next Refill.
	MaxRefillBatch = 512
	// MaxRestartHistory bounds a VM's remembered restarts, and so a restart
	// policy's Max.
	MaxRestartHistory = 16
	maxIDLen          = 64
	maxSnapshotDirLen = 1024
)

// GoldenStatus is a golden snapshot's state. A key with no record is absent.
type GoldenStatus uint8

// Golden statuses.
const (
	GoldenAbsent GoldenStatus = iota
	GoldenBuilding
	GoldenReady
	GoldenBroken // failed; retried at RetryAt
)

var goldenNames = [...]string{"absent", "building", "ready", "failed"}

func (g GoldenStatus) String() string { return enumName(goldenNames[:], int(g)) }

// VMStatus is a VM's state. Gone and failed VMs are removed from State (their
// history is the log); the values exist for events and views.
type VMStatus uint8

// VM statuses.
const (
	VMCloning VMStatus = iota + 1
	VMWarm
	VMClaimed
	VMHibernating
	VMHibernated
	VMWaking
	VMDestroying
	VMGone
	VMFailed
	// VMRestarting: a claimed VM whose VMM died is being booted again from
	// its own disk; its claim stays running. Appended after the others so
	// that no status changes its number.
	VMRestarting
	// VMCheckpointing: the VM's memory and disk are being captured into a
	// checkpoint (a running VM paused only for the snapshot, a hibernated
	// one not touched); it returns to claimed or hibernated after. Its
	// side effect is the checkpoint record's intent.
	VMCheckpointing
	// VMPromoting: the VM of a running or hibernated claim is being
	// snapshotted into a promoted template (templates.go); its claim keeps
	// its status.
	VMPromoting
	numVMStatus
)

var vmNames = [...]string{"", "cloning", "warm", "claimed", "hibernating", "hibernated", "waking", "destroying", "gone", "failed", "restarting", "checkpointing", "promoting"}

// inState reports whether VMs of status v are kept in State (gone and
// failed ones are not).
func (v VMStatus) inState() bool {
	return v >= VMCloning && v < VMGone || v == VMRestarting || v == VMCheckpointing || v == VMPromoting
}

func (v VMStatus) String() string { return enumName(vmNames[:], int(v)) }

// ClaimStatus is a claim's state. Pending, running, hibernating, hibernated
// and waking are live (they count against limits); the rest are ended.
type ClaimStatus uint8

// Claim statuses.
const (
	ClaimPending ClaimStatus = iota + 1
	ClaimRunning
	ClaimHibernating
	ClaimHibernated
	ClaimWaking
	ClaimReleased
	ClaimExpired
	ClaimFailed
	numClaimStatus
)

var claimNames = [...]string{"", "pending", "running", "hibernating", "hibernated", "waking", "released", "expired", "failed"}

func (c ClaimStatus) String() string { return enumName(claimNames[:], int(c)) }

// Live reports whether the claim still holds (or waits for) a VM.
func (c ClaimStatus) Live() bool { return c >= ClaimPending && c <= ClaimWaking }

// Tier says how a claim was served.
type Tier uint8

// Claim tiers, in the order they are tried.
const (
	TierWarm Tier = iota + 1
	TierClone
	TierCold
)

var tierNames = [...]string{"", "warm", "clone", "cold"}

func (t Tier) String() string { return enumName(tierNames[:], int(t)) }

func parseTier(s string) (Tier, bool) {
	for i, n := range tierNames {
		if i > 0 && n == s {
			return Tier(i), true
		}
	}
	return 0, false
}

func enumName(names []string, i int) string {
	if i > 0 && i < len(names) || (i == 0 && names[0] != "") {
		return names[i]
	}
	return "unknown"
}

// Park reasons.
const (
	ParkCapacity    = "capacity"
	ParkCloneFailed = "clone_failed"
)

// PoolRec is a pool's record. Draining pools (omitted from the last
// ConfigurePools) keep their record until their last VM is gone; a claim of
// a key without a record creates one, draining from the start (a zero
// spec: no warm target, no golden built for it), which goes the same way.
type PoolRec struct {
	Spec     PoolSpec
	Draining bool
	// ParkedUntil/ParkReason: refills are parked until that time.
	ParkedUntil int64
	ParkReason  string
	// Egress is the pool's egress policy (nil: none), read-only.
	Egress *egress.Policy

	// warm is the LIFO stack of warm VM ids (top = newest = next claimed).
	warm []string
	// Derived counters, rebuilt by Decode.
	refilling int // refill clones in flight (cloning VMs with no claim)
	vms       int // VM records of this pool, any status
	live      int // live claims of this pool
}

// warmStack is the warm stack of p, nil for no pool (a claim's key without
// one).
func (p *PoolRec) warmStack() []string {
	if p == nil {
		return nil
	}
	return p.warm
}

// WarmVMs returns the warm VM ids, oldest first (the last is claimed next).
func (p *PoolRec) WarmVMs() []string { return append([]string(nil), p.warm...) }

// GoldenRec is a golden snapshot's record.
type GoldenRec struct {
	Key         PoolKey
	Status      GoldenStatus
	Op          event.OpID // the build intent's op id while building
	ReqSeq      uint64
	SnapshotDir string
	Error       string
	RetryAt     int64
}

// VMRec is a VM's record.
type VMRec struct {
	ID       string
	Key      PoolKey
	Node     string
	Instance string
	RunDir   string
	Status   VMStatus
	// Claim is the claim the VM serves (or was created for); empty for a
	// refill clone until it is claimed.
	Claim string
	Cold  bool
	// Op is the op id of the side effect in flight (cloning, hibernating,
	// waking, destroying): executor results must name it as their cause.
	Op event.OpID
	// ReqSeq orders intents: the state's event count when it was requested.
	ReqSeq      uint64
	SnapshotDir string
	// Maps is the store dir whose memory-ranges the VM's VMM maps (the
	// golden it was cloned from), until the VMM is gone (store.go).
	Maps    string
	Created int64
	// SourceCk is the checkpoint the VM is cloned from (empty: its pool's
	// golden, or a cold boot).
	SourceCk string
	// Restarts are the times of the VM's most recent restart requests,
	// oldest first, at most MaxRestartHistory (read-only).
	Restarts []int64
}

// ClaimRec is a claim's record.
type ClaimRec struct {
	ID           string
	Key          PoolKey
	VM           string
	Tenant       string
	ClaimRef     string
	Metadata     map[string]string // read-only
	Tier         Tier
	Status       ClaimStatus
	TTLSeconds   int64
	Deadline     int64
	ServeBy      int64
	TokenGen     uint32
	Created      int64
	LastActivity int64
	Ended        int64
	Reason       string
	// Egress, pinned when the claim was made: the tenant's class then,
	// egress false, and whether the key had no configured pool.
	EgressClass string
	NoEgress    bool
	Unpooled    bool
	// Env is the claim's env, sorted by name, values sealed (read-only);
	// dropped when the claim ends.
	Env []egress.EnvEntry
	// FromCheckpoint: the checkpoint it was branched from; Fork: the
	// source checkpoint of the fork that made it.
	FromCheckpoint string
	Fork           string
	// Volumes are the claim's volumes (volumes.go), in the order asked
	// (read-only); dropped once the claim ended and its VM is gone.
	Volumes []ClaimVolume
}

// Limits are the claim limits; 0 means unlimited. TenantCaps are the caps
// of tenants not in the tenant table (logs written before tenants were
// state set them); a tenant in the table has its own (State.TenantCap).
type Limits struct {
	MaxClaims        int
	DefaultTenantCap int
	TenantCaps       map[string]int // read-only
}

// CapFor returns the live-claim cap of tenant (0 = unlimited). The empty
// tenant (root token) has no cap.
func (l *Limits) CapFor(tenant string) int {
	if tenant == "" {
		return 0
	}
	if c, ok := l.TenantCaps[tenant]; ok {
		return c
	}
	return l.DefaultTenantCap
}
