package event

// Archive events: a hibernated VM's snapshot moved to the node's second
// store (the archive) and back. They live in this file, with their type
// numbers and registry entries, so the shared tables in types.go and
// payloads.go stay untouched.

// Event types of the archive (append-only, like the others).
const (
	TypeArchiveRequested   Type = 60
	TypeArchived           Type = 61
	TypeArchiveFailed      Type = 62
	TypeUnarchiveRequested Type = 63
	TypeUnarchived         Type = 64
	TypeUnarchiveFailed    Type = 65
)

// On-expire actions of a claim (ClaimCreated.OnExpire, ClaimRenewed.OnExpire).
const (
	OnExpireDestroy = "destroy"
	OnExpireArchive = "archive"
)

// ArchiveRequested asks for a hibernated VM's snapshot to be archived.
// Reason: "expire" (the lease ended and the claim archives at expiry) or
// "idle" (its pool's archive_after_seconds passed since its last activity).
type ArchiveRequested struct {
	Claim  string `json:"claim"`
	VM     string `json:"vm"`
	Reason string `json:"reason"`
}

// Archived: the snapshot is durable and verified in the archive under
// Archive, and the local copy is gone. RetainUntilNS is the claim's new
// deadline (the archive's retention; 0 keeps it until released).
type Archived struct {
	Claim         string      `json:"claim"`
	VM            string      `json:"vm"`
	Archive       string      `json:"archive"`
	RetainUntilNS int64       `json:"retain_until_ns"`
	Report        *ExecReport `json:"report,omitempty"`
}

// ArchiveFailed: the archive was rolled back (the local snapshot is
// intact) and is retried at RetryAtNS, or, when Lost, the local snapshot
// is unusable.
type ArchiveFailed struct {
	Claim     string `json:"claim"`
	VM        string `json:"vm"`
	Error     string `json:"error"`
	Lost      bool   `json:"lost,omitempty"`
	RetryAtNS int64  `json:"retry_at_ns,omitempty"`
}

// UnarchiveRequested: a wake of an archived VM; its archive is copied back
// into the local store before the wake proper.
type UnarchiveRequested struct {
	Claim   string `json:"claim"`
	VM      string `json:"vm"`
	Archive string `json:"archive"`
}

// Unarchived: the archive is back in the local store as SnapshotDir,
// verified, and deleted from the archive. DeadlineNS is the claim's fresh
// lease.
type Unarchived struct {
	Claim       string      `json:"claim"`
	VM          string      `json:"vm"`
	SnapshotDir string      `json:"snapshot_dir"`
	DeadlineNS  int64       `json:"deadline_ns"`
	Report      *ExecReport `json:"report,omitempty"`
}

// UnarchiveFailed: the copy back failed and the archive is intact, or,
// when Lost, the archive is unusable (missing, or a checksum mismatch).
type UnarchiveFailed struct {
	Claim string `json:"claim"`
	VM    string `json:"vm"`
	Error string `json:"error"`
	Lost  bool   `json:"lost,omitempty"`
}

func (ArchiveRequested) EventType() Type   { return TypeArchiveRequested }
func (Archived) EventType() Type           { return TypeArchived }
func (ArchiveFailed) EventType() Type      { return TypeArchiveFailed }
func (UnarchiveRequested) EventType() Type { return TypeUnarchiveRequested }
func (Unarchived) EventType() Type         { return TypeUnarchived }
func (UnarchiveFailed) EventType() Type    { return TypeUnarchiveFailed }

func init() {
	for t, ti := range map[Type]typeInfo{
		TypeArchiveRequested:   {"archive_requested", 1, AggClaim},
		TypeArchived:           {"archived", 1, AggClaim},
		TypeArchiveFailed:      {"archive_failed", 1, AggClaim},
		TypeUnarchiveRequested: {"unarchive_requested", 1, AggClaim},
		TypeUnarchived:         {"unarchived", 1, AggClaim},
		TypeUnarchiveFailed:    {"unarchive_failed", 1, AggClaim},
	} {
		typeInfos[t] = ti
	}
	registerJSON[ArchiveRequested](1)
	registerJSON[Archived](1)
	registerJSON[ArchiveFailed](1)
	registerJSON[UnarchiveRequested](1)
	registerJSON[Unarchived](1)
	registerJSON[UnarchiveFailed](1)
}
