package event

// The snapshot store's events: promoted templates (a sandbox's snapshot
// made the golden of a new pool key), their labels and deletion, and the
// collection of snapshot dirs nothing references any more. Their types and
// aggregate kind (AggStore) are in types.go's registry with every other.

// PromoteRequested asks for the claim's VM to be snapshotted (running: in a
// pause window; hibernated: from its image, without waking) into a new
// golden of Key, the promoted template's key (the claim's net and size).
// Tenant is the caller's (empty: root), recorded as the template's owner.
type PromoteRequested struct {
	Claim  string  `json:"claim"`
	VM     string  `json:"vm"`
	Key    PoolKey `json:"key"`
	Tenant string  `json:"tenant,omitempty"`
}

// Promoted records the promote done: SnapshotDir (relative to the store) is
// Key's golden from now on, the template's content digest is Digest; a
// golden Key had before is retired.
type Promoted struct {
	Claim       string      `json:"claim"`
	VM          string      `json:"vm"`
	Key         PoolKey     `json:"key"`
	SnapshotDir string      `json:"snapshot_dir"`
	Digest      string      `json:"digest,omitempty"`
	Report      *ExecReport `json:"report,omitempty"`
}

// PromoteFailed records a promote rolled back (the VM as it was) or, with
// Lost, a VM that died in it.
type PromoteFailed struct {
	Claim string `json:"claim"`
	VM    string `json:"vm"`
	Error string `json:"error"`
	Lost  bool   `json:"lost,omitempty"`
}

// TemplateDeleted removes a promoted template; its golden is retired.
type TemplateDeleted struct {
	Key PoolKey `json:"key"`
}

// TemplateLabelsSet replaces a promoted template's labels (none: cleared).
type TemplateLabelsSet struct {
	Key    PoolKey           `json:"key"`
	Labels map[string]string `json:"labels,omitempty"`
}

// SnapshotCollected records a retired snapshot dir removed from the store.
type SnapshotCollected struct {
	Dir string `json:"dir"`
}

func (PromoteRequested) EventType() Type  { return TypePromoteRequested }
func (Promoted) EventType() Type          { return TypePromoted }
func (PromoteFailed) EventType() Type     { return TypePromoteFailed }
func (TemplateDeleted) EventType() Type   { return TypeTemplateDeleted }
func (TemplateLabelsSet) EventType() Type { return TypeTemplateLabelsSet }
func (SnapshotCollected) EventType() Type { return TypeSnapshotCollected }

func init() {
	registerJSON[PromoteRequested](1)
	registerJSON[Promoted](1)
	registerJSON[PromoteFailed](1)
	registerJSON[TemplateDeleted](1)
	registerJSON[TemplateLabelsSet](1)
	registerJSON[SnapshotCollected](1)
}
