package chdriver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/archive"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/executors/templates"
	"github.com/sbxlog/sbxlog/executors/transport"
	"github.com/sbxlog/sbxlog/executors/vmm"
)

// Hypervisor says which VMM binary the driver runs. It only matters for
// template synthesis (chsim) and is recorded in snapshot metadata.
type Hypervisor string

// Hypervisors.
const (
	CloudHypervisor Hypervisor = "cloud-hypervisor"
	CHSim           Hypervisor = "chsim"
)

// Taps creates and deletes the taps of egress VMs (tap.Kernel by default).
type Taps = tap.Maker

// Balloon tunes the wait for the balloon to settle before a pause.
type Balloon struct {
	// Poll is the vm.info interval (default 100 ms).
	Poll time.Duration
	// Stall gives up after this long without memory_actual_size moving
	// (default 2 s).
	Stall time.Duration
	// Max gives up after this long in all (default 60 s).
	Max time.Duration
}

// Config configures a Driver. Zero values take the defaults named per field.
type Config struct {
	Roots layout.Roots
	// Instance is this daemon's instance id: every run dir the driver acts
	// on must start with it, and destroys of another instance's VMs are
	// refused.
	Instance string
	// VMM is the absolute path of cloud-hypervisor or chsim.
	VMM        string
	Hypervisor Hypervisor
	// VMMEnv is added to every VMM's environment (SBX_CHSIM_* for chsim).
	VMMEnv []string
	// CgroupSlice puts each VMM into <slice>/vm-<id>.scope (vmm package);
	// empty: no scope.
	CgroupSlice string
	// RestoreMode is vm.restore's memory mode for clones and wakes (default
	// CopyOnWrite); VMs with shared or hugepage memory are restored Copy.
	RestoreMode ch.MemoryRestoreMode
	// AgentPort is the guest's control agent's vsock port (default
	// agent.VsockPort, 1024): the readiness probe connects to it, then the
	// clock is set over it (the protocol of executors/guest/agent).
	AgentPort uint32
	// SilkdPort is the guest agent's vsock port DialAgent connects to, the
	// data plane's (default silkd.Port, 2048).
	SilkdPort uint32
	// Sizes maps pool sizes to resources (default templates.DefaultSizes).
	Sizes templates.Sizes
	// Synth shapes synthesized chsim templates.
	Synth templates.SynthOptions
	// Bridge is the bridge egress taps attach to (required for egress pools).
	Bridge string
	// Taps defaults to netlink taps (package tap).
	Taps Taps
	// Egress, when set, locks every egress VM's tap (egress.go): after the
	// tap is made and before the VMM opens it, so no guest runs with open
	// egress; removed after the VMM is gone. Nil: taps are not locked.
	Egress EgressLane
	// Doors, when set, opens each VM's egress proxy doors once it runs and
	// closes them when it stops (refill and destroy, never a claim).
	Doors Doors
	// FS performs every filesystem side effect (default fsx.NewOS(Log)).
	FS fsx.FS
	// NewAPI returns the API client of a VMM socket (default ch.New).
	NewAPI func(socket string) API
	// Now is the clock for step timings, balloon waits and metadata
	// (default time.Now).
	Now func() time.Time

	// ReadyTimeout bounds the readiness probe after a restore (default 30 s).
	ReadyTimeout time.Duration
	// BootTimeout bounds the readiness probe after a cold boot (default 2 min).
	BootTimeout time.Duration
	// LaunchTimeout bounds a VMM's first vmm.ping (default vmm's 10 s).
	LaunchTimeout time.Duration
	// StopGrace is the grace of each of vmm.shutdown, SIGTERM, SIGKILL
	// (default 5 s).
	StopGrace time.Duration
	Balloon   Balloon
	// Warmup, if set, runs in a golden build after readiness and before the
	// balloon settles (e.g. to fill the page cache through the agent).
	Warmup func(ctx context.Context, vsockSocket string) error
	// DiskExtentBound is the extent count past which a hibernate snapshot's
	// disk is rewritten densely after the hibernate (rewrite.go; default
	// fsx.DefaultExtentBound, negative: never).
	DiskExtentBound int
	// Archive, when set, is the node's archive store: the driver performs
	// the archive intents (executors.Archiver, package archive) with it.
	Archive archive.Store
	// StepHook, if set, is called before every step and every rollback
	// action; an error fails the step (or skips the action) as if the step
	// itself had failed. Tests use it to crash recipes at chosen steps.
	StepHook func(ctx context.Context, s StepCall) error

	Log zerolog.Logger
}

// Driver is the CH executors.Driver.
type Driver struct {
	roots    layout.Roots
	instance string
	vmmBin   string
	hv       Hypervisor
	env      []string
	slice    string
	mode     ch.MemoryRestoreMode
	port     uint32
	silkd    uint32
	sizes    templates.Sizes
	synth    templates.SynthOptions
	bridge   string
	taps     Taps
	egress   EgressLane
	doors    Doors
	fs       fsx.FS
	newAPI   func(string) API
	now      func() time.Time
	readyTO  time.Duration
	bootTO   time.Duration
	launchTO time.Duration
	grace    time.Duration
	balloon  Balloon
	warmup   func(context.Context, string) error
	extents  int
	hook     func(context.Context, StepCall) error
	log      zerolog.Logger

	archive.Delegate // the archive intents (executors.Archiver)
	// The checkpoint imports (executors.CheckpointImporter), configured by
	// the node (UseTransport).
	transport.Receiver

	mu    sync.Mutex
	procs map[string]*vmm.Process // by run dir: VMMs this driver launched or adopted
	exits exitWatch               // watchers of procs (watch.go)
}

var _ executors.Driver = (*Driver)(nil)

// New checks cfg and returns a Driver. Call Prepare once before the first
// recipe.
func New(cfg Config) (*Driver, error) {
	if err := cfg.Roots.Validate(); err != nil {
		return nil, err
	}
	if err := layout.ValidInstance(cfg.Instance); err != nil {
		return nil, fmt.Errorf("chdriver: %w", err)
	}
	if cfg.VMM == "" || !filepath.IsAbs(cfg.VMM) {
		return nil, fmt.Errorf("chdriver: VMM binary %q is not an absolute path", cfg.VMM)
	}
	switch cfg.Hypervisor {
	case CloudHypervisor, CHSim:
	case "":
		cfg.Hypervisor = CloudHypervisor
		if filepath.Base(cfg.VMM) == "chsim" {
			cfg.Hypervisor = CHSim
		}
	default:
		return nil, fmt.Errorf("chdriver: hypervisor %q: want %s or %s", cfg.Hypervisor, CloudHypervisor, CHSim)
	}
	switch cfg.RestoreMode {
	case "":
		cfg.RestoreMode = ch.RestoreCopyOnWrite
	case ch.RestoreCopyOnWrite, ch.RestoreOnDemand, ch.RestoreCopy:
	default:
		return nil, fmt.Errorf("chdriver: restore mode %q: want CopyOnWrite, OnDemand or Copy", cfg.RestoreMode)
	}
	d := &Driver{
		roots: cfg.Roots, instance: cfg.Instance, vmmBin: cfg.VMM, hv: cfg.Hypervisor,
		env: cfg.VMMEnv, slice: cfg.CgroupSlice, mode: cfg.RestoreMode,
		port: cfg.AgentPort, silkd: cfg.SilkdPort, sizes: cfg.Sizes, synth: cfg.Synth, bridge: cfg.Bridge,
		taps: cfg.Taps, egress: cfg.Egress, doors: cfg.Doors, fs: cfg.FS, newAPI: cfg.NewAPI, now: cfg.Now,
		readyTO: cfg.ReadyTimeout, bootTO: cfg.BootTimeout, launchTO: cfg.LaunchTimeout,
		grace: cfg.StopGrace, balloon: cfg.Balloon, warmup: cfg.Warmup, hook: cfg.StepHook, extents: cfg.DiskExtentBound,
		log:   cfg.Log.With().Str("component", "chdriver").Logger(),
		procs: make(map[string]*vmm.Process),
	}
	if d.port == 0 {
		d.port = agent.VsockPort
	}
	if d.silkd == 0 {
		d.silkd = silkd.Port
	}
	if d.sizes == nil {
		d.sizes = templates.DefaultSizes
	}
	if d.taps == nil {
		d.taps = tap.Kernel{}
	}
	if d.fs == nil {
		d.fs = fsx.NewOS(cfg.Log)
	}
	if d.newAPI == nil {
		d.newAPI = func(s string) API { return ch.New(s) }
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.readyTO <= 0 {
		d.readyTO = 30 * time.Second
	}
	if d.bootTO <= 0 {
		d.bootTO = 2 * time.Minute
	}
	if d.grace <= 0 {
		d.grace = 5 * time.Second
	}
	if d.balloon.Poll <= 0 {
		d.balloon.Poll = 100 * time.Millisecond
	}
	if d.balloon.Stall <= 0 {
		d.balloon.Stall = 2 * time.Second
	}
	if d.balloon.Max <= 0 {
		d.balloon.Max = 60 * time.Second
	}
	if d.extents == 0 {
		d.extents = fsx.DefaultExtentBound
	}
	var err error
	d.Delegate, err = archive.NewDelegate(archive.Config{Store: cfg.Archive, Roots: d.roots, Instance: d.instance, FS: d.fs, Now: d.now, Log: d.log,
		Hook: func(ctx context.Context, recipe, step string, op event.OpID) error {
			if d.hook == nil {
				return nil
			}
			return d.hook(ctx, StepCall{Recipe: recipe, Step: step, Op: op})
		}})
	if err != nil {
		return nil, fmt.Errorf("chdriver: %w", err)
	}
	return d, nil
}

// PrepareReport says what Prepare found.
type PrepareReport struct {
	// CopyMode is how disks clone in the store: fsx.Reflink or fsx.Copy.
	CopyMode fsx.Method
	// Swept lists the temp dirs of crashed recipes that were removed.
	Swept []string
}

// Prepare makes the roots, checks that runs and store share a filesystem
// and that a VM's sockets fit a unix socket path, removes temp dirs left by
// a crash in the store and the templates root (it must run before any
// recipe, at start-up) and detects, once, whether the store can reflink; the
// copy fallback is logged.
func (d *Driver) Prepare(ctx context.Context) (PrepareReport, error) {
	var rep PrepareReport
	if err := d.roots.Make(d.instance, layout.GoldenStore, layout.HibernateStore, layout.CheckpointStore); err != nil {
		return rep, fmt.Errorf("chdriver: %w", err)
	}
	// vsock.sock is longer than vmm's api.sock, and its proxy doors
	// (vsock.sock_2049) longer still.
	sock := VsockFile
	if d.doors != nil {
		sock = VsockFile + "_00000"
	}
	if err := d.roots.CheckSocketPath(d.instance, sock); err != nil {
		return rep, fmt.Errorf("chdriver: %w", err)
	}
	for _, root := range []string{d.roots.Store, d.roots.Templates} {
		swept, err := fsx.SweepTemp(root)
		rep.Swept = append(rep.Swept, swept...)
		if err != nil {
			return rep, err
		}
	}
	swept, err := d.PrepareArchive()
	rep.Swept = append(rep.Swept, swept...)
	if err != nil {
		return rep, err
	}
	for _, p := range rep.Swept {
		d.log.Info().Str("path", p).Msg("removed a temp dir left by an interrupted recipe")
	}
	m, err := fsx.ClonerOf(d.fs, d.log).Detect(d.roots.Store)
	if err != nil {
		return rep, err
	}
	rep.CopyMode = m
	if m == fsx.Reflink {
		d.log.Info().Str("store", d.roots.Store).Msg("store filesystem reflinks: clones and hibernates share extents")
	} else {
		d.log.Warn().Str("store", d.roots.Store).Msg("store filesystem cannot reflink: every clone and hibernate copies cow.raw (sparse copy)")
	}
	return rep, nil
}

func (d *Driver) vmmConfig(runDir, id string) vmm.Config {
	return vmm.Config{
		Binary: d.vmmBin, RunDir: runDir, ID: id, CgroupSlice: d.slice,
		Env: d.env, ReadyTimeout: d.launchTO, Log: d.log,
	}
}

// attach returns the VMM serving runDir: one this driver holds, or one left
// by an earlier daemon (adopted). It returns nil, nil when no VMM of ours
// runs there. A process that is ours but does not answer is returned with
// the error, so the caller can terminate it.
func (d *Driver) attach(ctx context.Context, runDir, id string) (*vmm.Process, error) {
	d.mu.Lock()
	p := d.procs[runDir]
	if p != nil && !p.Alive() {
		delete(d.procs, runDir)
		d.unwatchLocked(p)
		p.Release()
		p = nil
	}
	d.mu.Unlock()
	if p != nil {
		return p, nil
	}
	p, err := vmm.Adopt(ctx, d.vmmConfig(runDir, id))
	switch {
	case err == nil:
		d.keep(runDir, p)
		return p, nil
	case p != nil:
		d.keep(runDir, p)
		return p, err
	case errors.Is(err, vmm.ErrNoProcess), errors.Is(err, vmm.ErrNotOurs):
		return nil, nil
	}
	return nil, err
}

func (d *Driver) keep(runDir string, p *vmm.Process) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if old := d.procs[runDir]; old != nil && old != p {
		d.unwatchLocked(old)
		old.Release()
	}
	d.procs[runDir] = p
	d.watchLocked(runDir, p)
}

func (d *Driver) forget(runDir string, p *vmm.Process) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.procs[runDir] == p {
		delete(d.procs, runDir)
		d.unwatchLocked(p)
	}
}

// launch starts a VMM for runDir.
func (d *Driver) launch(ctx context.Context, runDir, id string) (*vmm.Process, error) {
	p, err := vmm.Launch(ctx, d.vmmConfig(runDir, id))
	if err != nil {
		return nil, err
	}
	d.keep(runDir, p)
	return p, nil
}

// terminate stops p (nil: nothing runs) and forgets it.
func (d *Driver) terminate(ctx context.Context, runDir string, p *vmm.Process) error {
	if p == nil {
		return nil
	}
	d.expectExit(p)
	how, err := p.Terminate(ctx, d.grace)
	if err != nil {
		return err
	}
	if how == vmm.BySIGKILL {
		d.log.Warn().Str("run_dir", runDir).Msg("VMM needed SIGKILL")
	}
	d.forget(runDir, p)
	return nil
}

// Close forgets every VMM without touching it: VMs outlive the daemon.
func (d *Driver) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, p := range d.procs {
		d.unwatchLocked(p)
		p.Release()
		delete(d.procs, k)
	}
}

// api returns the API client of the VMM serving runDir.
func (d *Driver) api(runDir string) API { return d.newAPI(filepath.Join(runDir, vmm.SocketFile)) }

// restoreMode picks vm.restore's memory mode for a snapshot's config.
func (d *Driver) restoreMode(cfg *ch.VmConfig) ch.MemoryRestoreMode {
	if d.mode == ch.RestoreCopyOnWrite && (cfg.MemoryShared() || cfg.MemoryHugepages()) {
		return ch.RestoreCopy
	}
	return d.mode
}
