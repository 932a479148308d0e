package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
)

// Accel selects QEMU's accelerator.
type Accel string

const (
	// AccelTCG emulates the CPU in software: slow, but works everywhere (CI, nested).
	AccelTCG Accel = "tcg"
	// AccelKVM uses /dev/kvm.
	AccelKVM Accel = "kvm"
	// AccelAuto uses KVM only when a short probe boot under KVM answers, else TCG.
	AccelAuto Accel = "auto"
)

// ParseAccel accepts "tcg", "kvm" or "auto" ("" means auto).
func ParseAccel(s string) (Accel, error) {
	switch Accel(s) {
	case AccelTCG, AccelKVM, AccelAuto:
		return Accel(s), nil
	case "":
		return AccelAuto, nil
	}
	return "", fmt.Errorf("%w: accelerator %q (want tcg, kvm or auto)", ErrInvalidSpec, s)
}

// Errors of the driver.
var (
	// ErrInvalidSpec: a Spec field or snapshot name is unusable; the message says which.
	ErrInvalidSpec = errors.New("qemu: invalid spec")
	// ErrNotRunning: the run dir has no live QEMU process of this VM (no pid file, or
	// the pid's cmdline is not this VM's QEMU).
	ErrNotRunning = errors.New("qemu: VM not running")
	// ErrNoSnapshot: the snapshot directory is missing or incomplete (no meta.json).
	ErrNoSnapshot = errors.New("qemu: no such snapshot")
	// ErrExited: QEMU exited while the driver waited for it (the error carries the
	// tail of qemu.log).
	ErrExited = errors.New("qemu: process exited")
	// ErrMigration: a migration (save or restore of the device state) failed.
	ErrMigration = errors.New("qemu: migration failed")
	// ErrSnapshotExists: Hibernate was given the name of a snapshot older than the
	// running VM (names must not be reused while a snapshot of that name exists).
	ErrSnapshotExists = errors.New("qemu: snapshot name already taken")
)

// Spec describes one VM. RunDir holds everything of the running VM (RAM file,
// sockets, logs, pid file, vm.json) and belongs to the driver: Boot, Clone and Wake
// clear it, Hibernate and Destroy remove it. StoreDir is the snapshot store. RunDir
// and StoreDir must be on the same filesystem for clones to be reflinks; elsewhere
// they are copies. Socket paths must fit a unix socket (about 95 bytes of RunDir).
//
// Cold boots (Boot, Golden) use MemoryMiB, CPUs, Kernel, Initrd, Append and Disk.
// Restores (Clone, Wake) take all of these from the snapshot's meta.json instead,
// since the restored machine must match the saved one; only RunDir and StoreDir
// matter there.
type Spec struct {
	RunDir    string
	StoreDir  string
	MemoryMiB int
	// CPUs defaults to 1.
	CPUs   int
	Kernel string
	Initrd string
	// Append is added to the kernel command line.
	Append string
	// Disk, if set, is a qcow2 image cloned into the run dir (FileDisk) and
	// attached as a virtio-blk disk; the clone travels with every snapshot.
	// A template's is an empty overlay over its read-only rootfs.img, so a
	// clone copies only what the VM wrote, not the image (the backing file
	// is named by absolute path and must outlive every snapshot).
	Disk string
	// EgressNIC gives a cold-booted machine the egress NIC (egress.go),
	// recorded in its snapshots like the disk.
	EgressNIC bool
	// Egress is this VM's egress NIC on its tap (Boot, Clone, Wake): the
	// machine, booted or restored, must have the egress NIC. Nil with an
	// egress NIC: the NIC has no backend (a golden build).
	Egress *EgressNet
}

// Files of a run dir and of a snapshot.
const (
	FileRAM     = "ram"         // guest RAM (memory-backend-file, share=on)
	FileDisk    = "disk.qcow2"  // optional disk (qcow2, usually an overlay)
	FileState   = "state"       // migration stream: device state and non-shared RAM (snapshot only)
	FileMeta    = "meta.json"   // Meta (snapshot only)
	FileQMP     = "qmp.sock"    // QMP monitor
	FileAgent   = "agent.sock"  // host end of the guest's ttyS1 (executors/guest/agent protocol)
	FileConsole = "console.log" // guest ttyS0
	FileLog     = "qemu.log"    // QEMU's stdout and stderr
	FilePID     = "qemu.pid"
	FileVM      = "vm.json" // the Meta QEMU was launched with (run dir only)
)

// QMPSocket returns the QMP socket of the VM in runDir.
func QMPSocket(runDir string) string { return filepath.Join(runDir, FileQMP) }

// AgentSocket returns the agent socket of the VM in runDir; dial it with
// executors/guest/agent.Dial.
func AgentSocket(runDir string) string { return filepath.Join(runDir, FileAgent) }

// SnapshotDir returns where the snapshot name lives in the store.
func (s Spec) SnapshotDir(name string) string { return filepath.Join(s.StoreDir, name) }

func (s Spec) validateDirs() error {
	if s.RunDir == "" || !filepath.IsAbs(s.RunDir) {
		return fmt.Errorf("%w: run dir %q must be an absolute path", ErrInvalidSpec, s.RunDir)
	}
	if s.StoreDir == "" || !filepath.IsAbs(s.StoreDir) {
		return fmt.Errorf("%w: store dir %q must be an absolute path", ErrInvalidSpec, s.StoreDir)
	}
	for _, sock := range []string{QMPSocket(s.RunDir), AgentSocket(s.RunDir)} {
		if len(sock) > layout.MaxSocketPath {
			return fmt.Errorf("%w: socket path %s is %d bytes, over the %d a unix socket allows",
				ErrInvalidSpec, sock, len(sock), layout.MaxSocketPath)
		}
	}
	return nil
}

func (s Spec) validateBoot() error {
	if err := s.validateDirs(); err != nil {
		return err
	}
	if s.MemoryMiB < 16 || s.MemoryMiB > 1<<20 {
		return fmt.Errorf("%w: memory %d MiB (want 16..1048576)", ErrInvalidSpec, s.MemoryMiB)
	}
	if s.CPUs < 0 || s.CPUs > 256 {
		return fmt.Errorf("%w: %d CPUs", ErrInvalidSpec, s.CPUs)
	}
	for what, p := range map[string]string{"kernel": s.Kernel, "initrd": s.Initrd} {
		if p == "" {
			return fmt.Errorf("%w: no %s", ErrInvalidSpec, what)
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalidSpec, what, err)
		}
	}
	if s.Disk != "" {
		if st, err := os.Stat(s.Disk); err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("%w: disk %s is not a regular file (%v)", ErrInvalidSpec, s.Disk, err)
		}
	}
	return nil
}

func validateName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") ||
		strings.HasPrefix(name, fsx.TempPrefix) {
		return fmt.Errorf("%w: snapshot name %q", ErrInvalidSpec, name)
	}
	return nil
}

// Meta.Source's values: what made a snapshot.
const (
	sourceGolden    = "golden"
	sourceHibernate = "hibernate"
	// sourceCheckpoint: checkpoint.go.
	sourcePromote = "promote"
)

// MetaFormat is the version of meta.json this package writes and reads.
const MetaFormat = 1

// Meta is a snapshot's meta.json: what a restore needs to start a matching machine.
type Meta struct {
	Format int    `json:"format"`
	Source string `json:"source"` // sourceGolden, sourceHibernate, sourceCheckpoint or sourcePromote
	// Instance is the sandboxd instance that made the snapshot
	// (layout.ReadOwner).
	Instance    string `json:"instance,omitempty"`
	QEMUVersion string `json:"qemu_version"`
	Machine     string `json:"machine"`
	Accel       Accel  `json:"accel"`
	MemoryMiB   int    `json:"memory_mib"`
	CPUs        int    `json:"cpus"`
	Kernel      string `json:"kernel"`
	Initrd      string `json:"initrd"`
	Append      string `json:"append,omitempty"`
	Disk        bool   `json:"disk,omitempty"`
	// AgentNet: the machine has the agent network's NIC (agentnet.go), so a
	// restore must give it one too. Snapshots made before it existed have
	// none, and their VMs have no data plane.
	AgentNet bool `json:"agent_net,omitempty"`
	// EgressNIC: the machine has the egress NIC (egress.go) at its fixed
	// PCI slot, so a restore must give it one too (on the VM's tap, or
	// without a backend).
	EgressNIC bool `json:"egress_nic,omitempty"`
	// Volumes are the attached volumes (volumes.go): a restore launches
	// the machine with the same disks at the same slots.
	Volumes []MetaVolume `json:"volumes,omitempty"`
	// StateBytes is the size of the migration stream (device state plus the RAM
	// that is not in the shared RAM file: firmware and option ROMs).
	StateBytes int64     `json:"state_bytes"`
	Created    time.Time `json:"created"`
}

// ReadMeta reads and checks the meta.json of the snapshot in dir; a missing
// directory or file is ErrNoSnapshot.
func ReadMeta(dir string) (Meta, error) {
	var m Meta
	b, err := os.ReadFile(filepath.Join(dir, FileMeta))
	if errors.Is(err, os.ErrNotExist) {
		return m, fmt.Errorf("%w: %s", ErrNoSnapshot, dir)
	}
	if err != nil {
		return m, fmt.Errorf("qemu: read meta: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("qemu: %s/%s: %w", dir, FileMeta, err)
	}
	if m.Format != MetaFormat {
		return m, fmt.Errorf("qemu: %s/%s: format %d, want %d", dir, FileMeta, m.Format, MetaFormat)
	}
	if m.MemoryMiB <= 0 || m.Kernel == "" || m.Initrd == "" || m.Machine == "" {
		return m, fmt.Errorf("qemu: %s/%s: incomplete: %+v", dir, FileMeta, m)
	}
	if _, err := ParseAccel(string(m.Accel)); err != nil || m.Accel == AccelAuto {
		return m, fmt.Errorf("qemu: %s/%s: accelerator %q", dir, FileMeta, m.Accel)
	}
	return m, nil
}

// escape doubles commas, QEMU's escape inside an option value.
func escape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// DefaultAppend is the kernel command line before Spec.Append: console on ttyS0,
// reboot-on-panic off so that a panicking guest makes QEMU exit (-no-reboot).
const DefaultAppend = "console=ttyS0 panic=-1 quiet"

// cmdline returns QEMU's arguments for m in runDir; incoming adds -incoming defer
// (the device state then comes from migrate-incoming).
func cmdline(runDir string, m Meta, incoming bool) []string {
	mem := fmt.Sprintf("%dM", m.MemoryMiB)
	machine := fmt.Sprintf("%s,accel=%s,memory-backend=mem", m.Machine, m.Accel)
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-msg", "timestamp=on",
		"-machine", machine,
		"-m", mem,
		"-smp", fmt.Sprint(max(m.CPUs, 1)),
		// share=on: guest RAM lives in this file (not in anonymous memory), so a
		// snapshot is a reflink of it and x-ignore-shared keeps it out of the stream.
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%s,mem-path=%s,share=on",
			mem, escape(filepath.Join(runDir, FileRAM))),
		"-kernel", m.Kernel, "-initrd", m.Initrd,
		"-append", strings.TrimSpace(DefaultAppend + " " + m.Append),
		"-chardev", fmt.Sprintf("socket,id=qmp,path=%s,server=on,wait=off", escape(QMPSocket(runDir))),
		"-mon", "chardev=qmp,mode=control",
		"-chardev", fmt.Sprintf("file,id=console,path=%s,append=on", escape(filepath.Join(runDir, FileConsole))),
		"-serial", "chardev:console",
		"-chardev", fmt.Sprintf("socket,id=agent,path=%s,server=on,wait=off", escape(AgentSocket(runDir))),
		"-serial", "chardev:agent",
	}
	if m.Accel == AccelKVM {
		args = append(args, "-cpu", "host")
	}
	if m.Disk {
		args = append(args,
			"-drive", fmt.Sprintf("file=%s,format=qcow2,if=none,id=disk0", escape(filepath.Join(runDir, FileDisk))),
			"-device", "virtio-blk-pci,drive=disk0")
	}
	args = append(args, volumeArgs(m.Volumes)...)
	if incoming {
		// -S as well: after the state is loaded the VM stays paused until cont, so
		// the driver decides when the guest runs again.
		args = append(args, "-S", "-incoming", "defer")
	}
	return args
}
