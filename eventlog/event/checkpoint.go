package event

// CheckpointRequested asks for claim Claim's VM to be captured (memory and
// disk) into the store as checkpoint Checkpoint ("ck_" + 16 hex digits,
// minted by the API). Source is the hibernate snapshot it is exported from
// when the VM is hibernated (no VM is touched then); empty for a running VM,
// which is paused only for the snapshot. Fork marks a fork's source: never
// listed nor claimable, deleted once its children settled. ExpiresNS (0:
// never) is when a checkpoint kept for its own sake is deleted.
type CheckpointRequested struct {
	Checkpoint string  `json:"checkpoint"`
	Claim      string  `json:"claim"`
	VM         string  `json:"vm"`
	Key        PoolKey `json:"key"`
	Tenant     string  `json:"tenant,omitempty"`
	Name       string  `json:"name,omitempty"`
	Source     string  `json:"source,omitempty"`
	Fork       bool    `json:"fork,omitempty"`
	ExpiresNS  int64   `json:"expires_ns,omitempty"`
}

// CheckpointTaken: the checkpoint is durable in SnapshotDir (relative to the
// store); its VM runs (or stays hibernated) as before.
type CheckpointTaken struct {
	Checkpoint  string      `json:"checkpoint"`
	SnapshotDir string      `json:"snapshot_dir"`
	Report      *ExecReport `json:"report,omitempty"`
}

// CheckpointFailed: the capture was rolled back (nothing of it is in the
// store); Lost says the VM died with it.
type CheckpointFailed struct {
	Checkpoint string `json:"checkpoint"`
	Error      string `json:"error"`
	Lost       bool   `json:"lost,omitempty"`
}

// CheckpointDeleteRequested dooms a checkpoint: it is no longer listed or
// claimable, and its snapshot is removed as soon as no clone reads it.
// Reason: deleted (by its owner), expired (its TTL), fork_done, fork_failed,
// unreferenced (the last clone reading a doomed checkpoint settled).
type CheckpointDeleteRequested struct {
	Checkpoint string `json:"checkpoint"`
	Reason     string `json:"reason"`
}

// CheckpointDeleted: its snapshot is gone from the store.
type CheckpointDeleted struct {
	Checkpoint string      `json:"checkpoint"`
	Report     *ExecReport `json:"report,omitempty"`
}

func (CheckpointRequested) EventType() Type       { return TypeCheckpointRequested }
func (CheckpointTaken) EventType() Type           { return TypeCheckpointTaken }
func (CheckpointFailed) EventType() Type          { return TypeCheckpointFailed }
func (CheckpointDeleteRequested) EventType() Type { return TypeCheckpointDeleteRequested }
func (CheckpointDeleted) EventType() Type         { return TypeCheckpointDeleted }

func init() {
	registerJSON[CheckpointRequested](1)
	registerJSON[CheckpointTaken](1)
	registerJSON[CheckpointFailed](1)
	registerJSON[CheckpointDeleteRequested](1)
	registerJSON[CheckpointDeleted](1)
}
