package event

// Volumes: the node's catalog of host-side volumes (operator-owned disk
// images with a filesystem, attached to sandboxes as virtio-blk disks) and
// a claim's attachments. A claim's volumes asked for at claim time ride in
// ClaimCreated.Volumes and are attached once the claim runs (its
// ClaimCreated of tier warm, or its ClaimServed, requests them); a live
// attach or detach is a request event of its own. Each attachment's result
// is an event naming the one volume.

// VolumeSpec is one catalog entry: Name is also the disk's virtio serial
// (what the guest finds it by), Path the host's backing file, Writable
// whether a claim may attach it read-write, Tenants the tenants allowed to
// use it (empty: every tenant).
type VolumeSpec struct {
	Name     string   `json:"name"`
	Path     string   `json:"path"`
	Writable bool     `json:"writable,omitempty"`
	Tenants  []string `json:"tenants,omitempty"`
}

// ClaimVolume is one volume of a claim: its guest mount point (empty:
// attach only, the guest mounts nothing), whether it is read-write, and
// the backing file when it was granted (a later catalog change does not
// move an attached disk).
type ClaimVolume struct {
	Name  string `json:"name"`
	Mount string `json:"mount,omitempty"`
	RW    bool   `json:"rw,omitempty"`
	Path  string `json:"path"`
}

// VolumesConfigured replaces the node's volume catalog (from sandboxd's
// config at start, when it differs).
type VolumesConfigured struct {
	Volumes []VolumeSpec `json:"volumes"`
}

// VolumeAttachRequested asks for Volumes to be attached to the running
// claim's VM (a live attach).
type VolumeAttachRequested struct {
	Claim   string        `json:"claim"`
	VM      string        `json:"vm"`
	Volumes []ClaimVolume `json:"volumes"`
}

// VolumeAttached: Volume is attached to the claim's VM (and mounted where
// the claim asked).
type VolumeAttached struct {
	Claim  string `json:"claim"`
	VM     string `json:"vm"`
	Volume string `json:"volume"`
}

// VolumeAttachFailed: attaching Volume failed and was rolled back; a
// volume asked for at claim time fails its claim.
type VolumeAttachFailed struct {
	Claim  string `json:"claim"`
	VM     string `json:"vm"`
	Volume string `json:"volume"`
	Error  string `json:"error,omitempty"`
}

// VolumeDetachRequested asks for Volumes to be unmounted and detached from
// the running claim's VM.
type VolumeDetachRequested struct {
	Claim   string   `json:"claim"`
	VM      string   `json:"vm"`
	Volumes []string `json:"volumes"`
}

// VolumeDetached: Volume is gone from the claim's VM.
type VolumeDetached struct {
	Claim  string `json:"claim"`
	VM     string `json:"vm"`
	Volume string `json:"volume"`
}

// VolumeDetachFailed: Volume could not be detached (a busy mount) and
// stays attached.
type VolumeDetachFailed struct {
	Claim  string `json:"claim"`
	VM     string `json:"vm"`
	Volume string `json:"volume"`
	Error  string `json:"error,omitempty"`
}

func (VolumesConfigured) EventType() Type     { return TypeVolumesConfigured }
func (VolumeAttachRequested) EventType() Type { return TypeVolumeAttachRequested }
func (VolumeAttached) EventType() Type        { return TypeVolumeAttached }
func (VolumeAttachFailed) EventType() Type    { return TypeVolumeAttachFailed }
func (VolumeDetachRequested) EventType() Type { return TypeVolumeDetachRequested }
func (VolumeDetached) EventType() Type        { return TypeVolumeDetached }
func (VolumeDetachFailed) EventType() Type    { return TypeVolumeDetachFailed }

func init() {
	registerJSON[VolumesConfigured](1)
	registerJSON[VolumeAttachRequested](1)
	registerJSON[VolumeAttached](1)
	registerJSON[VolumeAttachFailed](1)
	registerJSON[VolumeDetachRequested](1)
	registerJSON[VolumeDetached](1)
	registerJSON[VolumeDetachFailed](1)
}
