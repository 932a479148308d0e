package event

// Checkpoint import events: a checkpoint another node took, fetched from it
// over the checkpoint transport (GET /v1/checkpoints/{id}/blob), verified and
// published into this node's store, after which this node holds it as its
// own. They live in this file, with their type numbers and registry entries,
// so the shared tables in types.go and payloads.go stay untouched.

// Event types of the checkpoint import (append-only, like the others).
const (
	TypeCheckpointImportRequested Type = 66
	TypeCheckpointImported        Type = 67
	TypeCheckpointImportFailed    Type = 68
)

// CheckpointImportRequested asks for checkpoint Checkpoint to be fetched from
// the node at Origin (its host:port, the address the cluster view names for
// the node whose tag the id carries).
type CheckpointImportRequested struct {
	Checkpoint string `json:"checkpoint"`
	Origin     string `json:"origin"`
}

// CheckpointImported: the checkpoint is durable in SnapshotDir (relative to
// the store), verified against its origin's digests; the rest is what the
// origin recorded of it (Claim: the sandbox it captured there).
type CheckpointImported struct {
	Checkpoint  string      `json:"checkpoint"`
	SnapshotDir string      `json:"snapshot_dir"`
	Key         PoolKey     `json:"key"`
	Name        string      `json:"name,omitempty"`
	Tenant      string      `json:"tenant,omitempty"`
	Claim       string      `json:"claim,omitempty"`
	CreatedNS   int64       `json:"created_ns"`
	ExpiresNS   int64       `json:"expires_ns,omitempty"`
	Report      *ExecReport `json:"report,omitempty"`
}

// CheckpointImportFailed: nothing of the import is in the store. Reason
// classifies Error for the claim waiting on it: "not_found" (the origin
// holds no such checkpoint), "unreachable" (the origin did not answer),
// "refused" (it answered something this node does not take: a digest
// mismatch, an unsafe entry, another hypervisor's format, too large).
type CheckpointImportFailed struct {
	Checkpoint string `json:"checkpoint"`
	Reason     string `json:"reason"`
	Error      string `json:"error"`
}

func (CheckpointImportRequested) EventType() Type { return TypeCheckpointImportRequested }
func (CheckpointImported) EventType() Type        { return TypeCheckpointImported }
func (CheckpointImportFailed) EventType() Type    { return TypeCheckpointImportFailed }

func init() {
	for t, ti := range map[Type]typeInfo{
		TypeCheckpointImportRequested: {"checkpoint_import_requested", 1, AggCheckpoint},
		TypeCheckpointImported:        {"checkpoint_imported", 1, AggCheckpoint},
		TypeCheckpointImportFailed:    {"checkpoint_import_failed", 1, AggCheckpoint},
	} {
		typeInfos[t] = ti
	}
	registerJSON[CheckpointImportRequested](1)
	registerJSON[CheckpointImported](1)
	registerJSON[CheckpointImportFailed](1)
}
