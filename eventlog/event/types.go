package event

import (
	"fmt"
	"slices"
)

// Type is an event's type tag. The numbering is append-only: never renumber,
// never reuse a retired number (mark it retired in typeInfos instead).
type Type uint16

// Event types. Add new ones at the end with the next number. The payload of
// each is the struct of the same name in payloads.go.
const (
	TypeInvalid Type = 0

	// Node configuration.
	TypePoolsConfigured  Type = 1
	TypeLimitsConfigured Type = 2

	// Golden snapshot lifecycle.
	TypeGoldenBuildRequested Type = 3
	TypeGoldenBuilt          Type = 4
	TypeGoldenFailed         Type = 5

	// VM lifecycle.
	TypeVMCloneRequested   Type = 6
	TypeVMCloned           Type = 7
	TypeVMCloneFailed      Type = 8
	TypeVMDestroyRequested Type = 9
	TypeVMDestroyed        Type = 10
	TypeVMExited           Type = 11

	// Claims.
	TypeClaimCreated  Type = 12
	TypeClaimServed   Type = 13
	TypeClaimFailed   Type = 14
	TypeClaimRenewed  Type = 15
	TypeClaimReleased Type = 16

	// Hibernate and wake.
	TypeHibernateRequested Type = 17
	TypeHibernated         Type = 18
	TypeHibernateFailed    Type = 19
	TypeWakeRequested      Type = 20
	TypeWoken              Type = 21
	TypeWakeFailed         Type = 22

	// Refill parking (capacity or a failing clone).
	TypePoolParked   Type = 23
	TypePoolUnparked Type = 24

	TypeNodeConfigured Type = 25
	TypeClaimTouched   Type = 26
	TypeClaimExpired   Type = 27

	// Cold restart of a claimed VM whose VMM died (restart policy).
	TypeVMRestartRequested Type = 28
	TypeVMRestarted        Type = 29
	TypeVMRestartFailed    Type = 30

	// Tenants: the set of tenant tokens (by hash) and caps, changed at
	// runtime over the API or seeded from sandboxd's config.
	TypeTenantPut     Type = 31
	TypeTenantRemoved Type = 32

	// Node drain: the node takes no claims and keeps no warm VMs until it
	// is uncordoned.
	TypeNodeDrained    Type = 33
	TypeNodeUncordoned Type = 34

	// Data-plane relays (a client connection spliced to a claim's guest):
	// facts in the log so audit and the idle rule derive from it.
	TypeRelayOpened Type = 35
	TypeRelayClosed Type = 36

	// Guarded egress: the pools' and egress classes' policies, a claim's
	// env (its values sealed, never in the clear) and the egress usage the
	// proxy aggregated per sandbox and interval.
	TypeEgressPoolSet      Type = 37
	TypeEgressClassPut     Type = 38
	TypeEgressClassRemoved Type = 39
	TypeClaimEnvChanged    Type = 40
	TypeEgressUsage        Type = 41

	// Checkpoints: a claim's memory and disk captured into the store under
	// an id (a fork's children are cloned from one), claimable, and
	// deleted once nothing clones from them.
	TypeCheckpointRequested       Type = 42
	TypeCheckpointTaken           Type = 43
	TypeCheckpointFailed          Type = 44
	TypeCheckpointDeleteRequested Type = 45
	TypeCheckpointDeleted         Type = 46
	// The snapshot store (store.go): promoted templates, their labels and
	// deletion, and the collection of unreferenced snapshot dirs.
	TypePromoteRequested  Type = 47
	TypePromoted          Type = 48
	TypePromoteFailed     Type = 49
	TypeTemplateDeleted   Type = 50
	TypeTemplateLabelsSet Type = 51
	TypeSnapshotCollected Type = 52
	// Volumes (volumes.go): the catalog and a claim's attachments.
	TypeVolumesConfigured     Type = 53
	TypeVolumeAttachRequested Type = 54
	TypeVolumeAttached        Type = 55
	TypeVolumeAttachFailed    Type = 56
	TypeVolumeDetachRequested Type = 57
	TypeVolumeDetached        Type = 58
	TypeVolumeDetachFailed    Type = 59
)

// AggKind is the kind of aggregate an event belongs to.
type AggKind uint8

// Aggregate kinds; append-only like Type.
const (
	AggInvalid AggKind = 0
	AggNode    AggKind = 1
	AggPool    AggKind = 2
	AggGolden  AggKind = 3
	AggVM      AggKind = 4
	AggClaim   AggKind = 5
	AggTenant  AggKind = 6
	AggEgress  AggKind = 7 // an egress class

	// A checkpoint (fsm/checkpoint.go).
	AggCheckpoint AggKind = 8
	// A snapshot dir in the store (its id is the dir, relative to the
	// store).
	AggStore AggKind = 9
)

type typeInfo struct {
	name    string
	version uint16 // current schema version written by this build
	agg     AggKind
}

// typeInfos is the registry of every type this build can read. A retired type
// keeps its entry so old logs stay readable.
var typeInfos = map[Type]typeInfo{
	TypePoolsConfigured:      {"pools_configured", 1, AggNode},
	TypeLimitsConfigured:     {"limits_configured", 1, AggNode},
	TypeGoldenBuildRequested: {"golden_build_requested", 1, AggGolden},
	TypeGoldenBuilt:          {"golden_built", 1, AggGolden},
	TypeGoldenFailed:         {"golden_failed", 1, AggGolden},
	TypeVMCloneRequested:     {"vm_clone_requested", 1, AggVM},
	TypeVMCloned:             {"vm_cloned", 1, AggVM},
	TypeVMCloneFailed:        {"vm_clone_failed", 1, AggVM},
	TypeVMDestroyRequested:   {"vm_destroy_requested", 1, AggVM},
	TypeVMDestroyed:          {"vm_destroyed", 1, AggVM},
	TypeVMExited:             {"vm_exited", 1, AggVM},
	TypeClaimCreated:         {"claim_created", 2, AggClaim},
	TypeClaimServed:          {"claim_served", 1, AggClaim},
	TypeClaimFailed:          {"claim_failed", 1, AggClaim},
	TypeClaimRenewed:         {"claim_renewed", 1, AggClaim},
	TypeClaimReleased:        {"claim_released", 1, AggClaim},
	TypeHibernateRequested:   {"hibernate_requested", 1, AggClaim},
	TypeHibernated:           {"hibernated", 1, AggClaim},
	TypeHibernateFailed:      {"hibernate_failed", 1, AggClaim},
	TypeWakeRequested:        {"wake_requested", 1, AggClaim},
	TypeWoken:                {"woken", 1, AggClaim},
	TypeWakeFailed:           {"wake_failed", 1, AggClaim},
	TypePoolParked:           {"pool_parked", 1, AggPool},
	TypePoolUnparked:         {"pool_unparked", 1, AggPool},
	TypeNodeConfigured:       {"node_configured", 1, AggNode},
	TypeClaimTouched:         {"claim_touched", 1, AggClaim},
	TypeClaimExpired:         {"claim_expired", 1, AggClaim},
	TypeVMRestartRequested:   {"vm_restart_requested", 1, AggVM},
	TypeVMRestarted:          {"vm_restarted", 1, AggVM},
	TypeVMRestartFailed:      {"vm_restart_failed", 1, AggVM},
	TypeTenantPut:            {"tenant_put", 1, AggTenant},
	TypeTenantRemoved:        {"tenant_removed", 1, AggTenant},
	TypeNodeDrained:          {"node_drained", 1, AggNode},
	TypeNodeUncordoned:       {"node_uncordoned", 1, AggNode},
	TypeRelayOpened:          {"relay_opened", 1, AggClaim},
	TypeRelayClosed:          {"relay_closed", 1, AggClaim},
	TypeEgressPoolSet:        {"egress_pool_set", 1, AggPool},
	TypeEgressClassPut:       {"egress_class_put", 1, AggEgress},
	TypeEgressClassRemoved:   {"egress_class_removed", 1, AggEgress},
	TypeClaimEnvChanged:      {"claim_env_changed", 1, AggClaim},
	TypeEgressUsage:          {"egress_usage", 1, AggClaim},

	// Checkpoints.
	TypeCheckpointRequested:       {"checkpoint_requested", 1, AggCheckpoint},
	TypeCheckpointTaken:           {"checkpoint_taken", 1, AggCheckpoint},
	TypeCheckpointFailed:          {"checkpoint_failed", 1, AggCheckpoint},
	TypeCheckpointDeleteRequested: {"checkpoint_delete_requested", 1, AggCheckpoint},
	TypeCheckpointDeleted:         {"checkpoint_deleted", 1, AggCheckpoint},

	// The snapshot store.
	TypePromoteRequested:  {"promote_requested", 1, AggClaim},
	TypePromoted:          {"promoted", 1, AggClaim},
	TypePromoteFailed:     {"promote_failed", 1, AggClaim},
	TypeTemplateDeleted:   {"template_deleted", 1, AggGolden},
	TypeTemplateLabelsSet: {"template_labels_set", 1, AggGolden},
	TypeSnapshotCollected: {"snapshot_collected", 1, AggStore},

	// Volumes.
	TypeVolumesConfigured:     {"volumes_configured", 1, AggNode},
	TypeVolumeAttachRequested: {"volume_attach_requested", 1, AggClaim},
	TypeVolumeAttached:        {"volume_attached", 1, AggClaim},
	TypeVolumeAttachFailed:    {"volume_attach_failed", 1, AggClaim},
	TypeVolumeDetachRequested: {"volume_detach_requested", 1, AggClaim},
	TypeVolumeDetached:        {"volume_detached", 1, AggClaim},
	TypeVolumeDetachFailed:    {"volume_detach_failed", 1, AggClaim},
}

// Known reports whether this build can read events of type t.
func (t Type) Known() bool { _, ok := typeInfos[t]; return ok }

// String returns the type's stable name (used in /v1/events and JSON dumps).
func (t Type) String() string {
	if ti, ok := typeInfos[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint16(t))
}

// Version returns the schema version this build writes for t (0 if unknown).
func (t Type) Version() uint16 { return typeInfos[t].version }

// Aggregate returns the aggregate kind events of type t belong to.
func (t Type) Aggregate() AggKind { return typeInfos[t].agg }

// ParseType maps a stable name back to its Type.
func ParseType(name string) (Type, bool) {
	for t, ti := range typeInfos {
		if ti.name == name {
			return t, true
		}
	}
	return TypeInvalid, false
}

// Types returns every known type in numeric order.
func Types() []Type {
	out := make([]Type, 0, len(typeInfos))
	for t := range typeInfos {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

var aggNames = [...]string{AggInvalid: "invalid", AggNode: "node", AggPool: "pool", AggGolden: "golden", AggVM: "vm", AggClaim: "claim", AggTenant: "tenant", AggEgress: "egress", AggCheckpoint: "checkpoint", AggStore: "store"}

// String returns the aggregate kind's stable name.
func (k AggKind) String() string {
	if int(k) < len(aggNames) {
		return aggNames[k]
	}
	return fmt.Sprintf("agg(%d)", uint8(k))
}

// Known reports whether k is a defined aggregate kind.
func (k AggKind) Known() bool { return k > AggInvalid && int(k) < len(aggNames) }
