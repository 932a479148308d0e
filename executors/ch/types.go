package ch

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

// VmState is the state vm.info reports.
type VmState string

// The states of CH's VmState enum.
const (
	StateCreated    VmState = "Created"
	StateRunning    VmState = "Running"
	StateShutdown   VmState = "Shutdown"
	StatePaused     VmState = "Paused"
	StateBreakPoint VmState = "BreakPoint"
)

// VmInfo is the body of vm.info.
type VmInfo struct {
	Config *VmConfig `json:"config"`
	State  VmState   `json:"state"`
	// MemoryActualSize is the guest memory minus what the balloon holds.
	MemoryActualSize int64                 `json:"memory_actual_size"`
	DeviceTree       map[string]DeviceNode `json:"device_tree,omitempty"`
}

// DeviceNode is one entry of vm.info's device tree.
type DeviceNode struct {
	ID        string            `json:"id,omitempty"`
	Resources []json.RawMessage `json:"resources,omitempty"`
	Children  []string          `json:"children,omitempty"`
	PciBdf    string            `json:"pci_bdf,omitempty"`
}

// PingResponse is the body of vmm.ping.
type PingResponse struct {
	BuildVersion string   `json:"build_version,omitempty"`
	Version      string   `json:"version"`
	Pid          int64    `json:"pid,omitempty"`
	Features     []string `json:"features,omitempty"`
}

// MemoryRestoreMode selects how vm.restore brings guest memory back.
type MemoryRestoreMode string

// The restore modes of the CH fork this project targets.
const (
	// RestoreCopy reads the whole memory file into fresh anonymous memory.
	RestoreCopy MemoryRestoreMode = "Copy"
	// RestoreOnDemand faults pages in from the file as the guest touches them.
	RestoreOnDemand MemoryRestoreMode = "OnDemand"
	// RestoreCopyOnWrite maps memory-ranges MAP_PRIVATE: the file must stay
	// unchanged on disk for the VM's lifetime (truncating it kills the guest).
	RestoreCopyOnWrite MemoryRestoreMode = "CopyOnWrite"
)

// RestoreConfig is the body of vm.restore.
type RestoreConfig struct {
	// SourceURL is "file://<snapshot dir>"; see FileURL.
	SourceURL string `json:"source_url"`
	// MemoryRestoreMode is left to the server's default (Copy) when empty.
	MemoryRestoreMode MemoryRestoreMode `json:"memory_restore_mode,omitempty"`
	// Resume runs the VM once restored; otherwise it stays Paused.
	Resume   bool `json:"resume,omitempty"`
	Prefault bool `json:"prefault,omitempty"`
}

// NetConfig is the body of vm.add-net (the fields this project sets; CH has
// more).
type NetConfig struct {
	Tap       string `json:"tap,omitempty"`
	IP        string `json:"ip,omitempty"`
	Mask      string `json:"mask,omitempty"`
	Mac       string `json:"mac,omitempty"`
	HostMac   string `json:"host_mac,omitempty"`
	MTU       int    `json:"mtu,omitempty"`
	NumQueues int    `json:"num_queues,omitempty"`
	QueueSize int    `json:"queue_size,omitempty"`
	ID        string `json:"id,omitempty"`
}

// DiskConfig is the body of vm.add-disk (the fields this project sets; CH
// has more): a volume's backing file, read-only unless a claim asked for
// it read-write, with its name as the virtio serial the guest finds it by.
type DiskConfig struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly,omitempty"`
	Serial   string `json:"serial,omitempty"`
	ID       string `json:"id,omitempty"`
}

// PciDeviceInfo is what a hot-plug answers with.
type PciDeviceInfo struct {
	ID  string `json:"id"`
	BDF string `json:"bdf"`
}

// Resize is the body of vm.resize; nil fields are left unchanged.
type Resize struct {
	DesiredVcpus   *int   `json:"desired_vcpus,omitempty"`
	DesiredRAM     *int64 `json:"desired_ram,omitempty"`
	DesiredBalloon *int64 `json:"desired_balloon,omitempty"`
}

// ResizeBalloon is a Resize that only sets the balloon's target size in
// bytes (0 deflates it completely).
func ResizeBalloon(bytes int64) Resize { return Resize{DesiredBalloon: &bytes} }

// Counters is the body of vm.counters: device id -> counter -> value.
type Counters map[string]map[string]int64

// FileURL turns a directory into the file:// URL vm.snapshot and vm.restore
// take. The path must be absolute; CH resolves it in its own working
// directory otherwise.
func FileURL(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("ch: snapshot dir %q is not absolute", dir)
	}
	return "file://" + filepath.Clean(dir), nil
}

// URLPath is the inverse of FileURL: the directory of a file:// URL.
func URLPath(u string) (string, error) {
	rest, ok := strings.CutPrefix(u, "file://")
	if !ok {
		return "", fmt.Errorf("ch: %q is not a file:// URL", u)
	}
	if rest == "" || !filepath.IsAbs(rest) {
		return "", fmt.Errorf("ch: %q does not name an absolute path", u)
	}
	return rest, nil
}
