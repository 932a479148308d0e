package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/archive"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/executors/transport"
	"github.com/sbxlog/sbxlog/fsm"
)

// Size is what a pool size gives a VM.
type Size struct {
	MemoryMiB int
	CPUs      int
}

// Sizes maps a pool size name to a Size.
type Sizes map[string]Size

// DefaultSizes are the one size table, fsm.Sizes: what a VM gets under KVM,
// the same as under Cloud Hypervisor. Under TCG it gets less (underTCG).
var DefaultSizes = sizesOf(fsm.Sizes)

func sizesOf(table []fsm.Size) Sizes {
	s := make(Sizes, len(table))
	for _, z := range table {
		s[z.Name] = Size{MemoryMiB: z.MemoryMiB, CPUs: z.VCPUs}
	}
	return s
}

// underTCG is what a VM of size z gets under TCG (fsm.Size.UnderTCG, the
// one rule); it reports whether maxMiB cut the memory.
func (z Size) underTCG(maxMiB int) (Size, bool) {
	t, capped := fsm.Size{VCPUs: z.CPUs, MemoryMiB: z.MemoryMiB}.UnderTCG(maxMiB)
	return Size{MemoryMiB: t.MemoryMiB, CPUs: t.VCPUs}, capped
}

// Lookup returns the Size of name; an unknown name is an error listing the
// known ones.
func (s Sizes) Lookup(name string) (Size, error) {
	z, ok := s[name]
	if !ok || z.MemoryMiB <= 0 || z.CPUs <= 0 {
		names := make([]string, 0, len(s))
		for k := range s {
			names = append(names, k)
		}
		sort.Strings(names)
		return Size{}, fmt.Errorf("qemu: unknown size %q (have %v)", name, names)
	}
	return z, nil
}

// DefaultTCGMaxMemoryMiB caps a VM's memory under TCG (Config.TCGMaxMemoryMiB),
// after the halving of underTCG.
const DefaultTCGMaxMemoryMiB = 1024

// NetEgress is the pool net whose VMs get the egress NIC on a locked tap
// (egress.go; Config.Egress).
const NetEgress = "egress"

// Config configures a Driver. Zero values take the defaults named per field.
type Config struct {
	Roots layout.Roots
	// Instance is this daemon's instance id: every run dir the driver acts on
	// must start with it.
	Instance string
	// QEMU is the emulator binary (default "qemu-system-x86_64" from PATH).
	QEMU string
	// Accel is tcg, kvm or auto (default auto: KVM only if a short probe boot
	// answers; see RecipesConfig).
	Accel Accel
	// Templates is the template table: what a pool's template boots (`make
	// guest` builds "busybox" and "default"; CachedTemplates finds the
	// builds). A template not in it is refused. The files are checked when a
	// golden build or cold boot needs them, not by New, so a daemon without
	// a guest still starts and reports why its pools stay empty.
	Templates map[string]Guest
	// Sizes maps pool sizes to memory and vCPUs as under KVM (default
	// DefaultSizes, the size table fsm.Sizes); under TCG a VM gets half of
	// each (at least one vCPU), memory capped at TCGMaxMemoryMiB.
	Sizes Sizes
	// TCGMaxMemoryMiB caps memory under TCG after the halving (default
	// DefaultTCGMaxMemoryMiB; negative: no cap).
	TCGMaxMemoryMiB int
	// FS performs every filesystem side effect (default fsx.NewOS(Log)); tests
	// wrap it in an fsx.Recorder.
	FS fsx.FS
	// Now is the clock for step timings and snapshot metadata (default
	// time.Now).
	Now func() time.Time
	// BootTimeout, ReadyTimeout and StopGrace are RecipesConfig's (defaults
	// 2 min, 30 s, 5 s).
	BootTimeout, ReadyTimeout, StopGrace time.Duration
	// ResumeTimeout bounds making a VM run again after a failed hibernate
	// (default 30 s).
	ResumeTimeout time.Duration
	// Egress, when set, runs `net: egress` pools (egress.go): the bridge,
	// the lane that locks taps, the proxy doors and the node CA. Nil:
	// egress pools are refused (Unrecoverable).
	Egress *Egress
	// Archive, when set, is the node's archive store: the driver performs
	// the archive intents (executors.Archiver, package archive) with it.
	Archive archive.Store
	// StepHook is RecipesConfig's (the SBX_CRASH_AT seam); ArchiveHook
	// is the archive executor's (archive.Config.Hook).
	StepHook    func(recipe, step string)
	ArchiveHook func(ctx context.Context, recipe, step string, op event.OpID) error
	Log         zerolog.Logger
}

// Driver is the QEMU executors.Driver.
type Driver struct {
	roots     layout.Roots
	instance  string
	templates map[string]Guest
	sizes     Sizes
	tcgMax    int
	fs        fsx.FS
	now       func() time.Time
	archive.Delegate
	// The checkpoint imports (executors.CheckpointImporter), configured by
	// the node (UseTransport).
	transport.Receiver
	resumeTO time.Duration
	log      zerolog.Logger
	qemuBin  string
	q        *Recipes
	egress   *Egress

	copyMode atomic.Int64 // fsx.Method detected by Prepare
	capped   sync.Map     // size name -> struct{}: the TCG cap was logged

	wmu     sync.Mutex // guards onExit and watched
	onExit  func(Exit)
	watched map[string]*watcher // by run dir
}

var _ executors.Driver = (*Driver)(nil)

// New checks cfg and returns a Driver. Call Prepare once before the first
// recipe.
func New(cfg Config) (*Driver, error) {
	if err := cfg.Roots.Validate(); err != nil {
		return nil, err
	}
	if err := layout.ValidInstance(cfg.Instance); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	templates := make(map[string]Guest, len(cfg.Templates))
	for name, g := range cfg.Templates {
		if name == "" {
			return nil, errors.New("qemu: a template without a name")
		}
		if err := fsm.ValidKey(fsm.PoolKey{Template: name, Net: "none", Size: "small"}); err != nil {
			return nil, fmt.Errorf("qemu: templates: %w", err)
		}
		for what, p := range map[string]string{"kernel": g.Kernel, "initrd": g.Initrd, "disk": g.Disk} {
			if p != "" && !filepath.IsAbs(p) {
				return nil, fmt.Errorf("qemu: template %s: %s %q is not an absolute path", name, what, p)
			}
		}
		templates[name] = g
	}
	// "default" is always a template, built or not: a claim of it on a node
	// without the build is told to run `make guest` (by the golden build or
	// cold boot), not that the template does not exist.
	if _, ok := templates[TemplateDefault]; !ok {
		templates[TemplateDefault] = Guest{}
	}
	if cfg.Sizes == nil {
		cfg.Sizes = DefaultSizes
	}
	for name, z := range cfg.Sizes {
		if z.MemoryMiB < 16 || z.CPUs < 1 {
			return nil, fmt.Errorf("qemu: size %q: %d MiB, %d CPUs (want >= 16 MiB, >= 1 CPU)", name, z.MemoryMiB, z.CPUs)
		}
	}
	if cfg.TCGMaxMemoryMiB == 0 {
		cfg.TCGMaxMemoryMiB = DefaultTCGMaxMemoryMiB
	}
	if cfg.FS == nil {
		cfg.FS = fsx.NewOS(cfg.Log)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ResumeTimeout <= 0 {
		cfg.ResumeTimeout = 30 * time.Second
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	log := cfg.Log.With().Str("component", "qemu").Logger()
	q, err := NewRecipes(RecipesConfig{
		QEMU: cfg.QEMU, Accel: cfg.Accel, FS: cfg.FS, Log: log, Now: cfg.Now, Instance: cfg.Instance,
		BootTimeout: cfg.BootTimeout, ReadyTimeout: cfg.ReadyTimeout, StopGrace: cfg.StopGrace, StepHook: cfg.StepHook,
	})
	if err != nil {
		return nil, err
	}
	var eg *Egress
	if cfg.Egress != nil {
		c := *cfg.Egress
		if c.Taps == nil {
			c.Taps = tap.Kernel{}
		}
		eg = &c
	}
	arch, err := archive.NewDelegate(archive.Config{Store: cfg.Archive, Roots: cfg.Roots, Instance: cfg.Instance, FS: cfg.FS, Now: cfg.Now, Log: log, Hook: cfg.ArchiveHook})
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	return &Driver{
		roots: cfg.Roots, instance: cfg.Instance, templates: templates,
		sizes: cfg.Sizes, tcgMax: cfg.TCGMaxMemoryMiB, fs: cfg.FS, now: cfg.Now,
		resumeTO: cfg.ResumeTimeout, log: log, qemuBin: cfg.QEMU, q: q, egress: eg, Delegate: arch,
	}, nil
}

// Recipes returns the recipe runner underneath (benchmarks, tests).
func (d *Driver) Recipes() *Recipes { return d.q }

// PrepareReport says what Prepare found.
type PrepareReport struct {
	// CopyMode is how RAM files clone in the store: fsx.Reflink or fsx.Copy.
	CopyMode fsx.Method
	// Swept lists the temp dirs of interrupted recipes (and run dirs of
	// interrupted KVM probes) that were removed.
	Swept []string
}

// Prepare makes the roots, checks that runs and store share a filesystem and
// that a VM's sockets fit a unix socket path, removes temp dirs and KVM probe
// VMs left by a crash (it must run before any recipe, at start-up) and
// detects whether the store can reflink. A missing guest is only logged: BuildGolden reports it.
func (d *Driver) Prepare(ctx context.Context) (PrepareReport, error) {
	var rep PrepareReport
	stores := []string{d.roots.Store, filepath.Join(d.roots.Store, layout.GoldenStore), filepath.Join(d.roots.Store, layout.HibernateStore),
		filepath.Join(d.roots.Store, layout.CheckpointStore)}
	if err := d.roots.Make(d.instance, layout.GoldenStore, layout.HibernateStore, layout.CheckpointStore); err != nil {
		return rep, fmt.Errorf("qemu: %w", err)
	}
	// agent.sock is the longest socket name.
	if err := d.roots.CheckSocketPath(d.instance, FileAgent); err != nil {
		return rep, fmt.Errorf("qemu: %w", err)
	}
	// Recipes assemble snapshots next to their final place (golden/,
	// hibernate/); the top level is swept as well, where layout.Roots
	// documents temp dirs.
	for _, dir := range stores {
		swept, err := fsx.SweepTemp(dir)
		rep.Swept = append(rep.Swept, swept...)
		if err != nil {
			return rep, err
		}
	}
	// KVM probe boots (accel auto) run next to the VM that needed them.
	probes, _ := filepath.Glob(filepath.Join(d.roots.Runs, d.instance, ProbeDirPrefix+"*"))
	for _, dir := range probes {
		if _, err := d.q.Destroy(ctx, Spec{RunDir: dir, StoreDir: d.roots.Store}); err != nil {
			return rep, fmt.Errorf("qemu: removing KVM probe %s: %w", dir, err)
		}
		rep.Swept = append(rep.Swept, dir)
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
	d.copyMode.Store(int64(m))
	if m == fsx.Reflink {
		d.log.Info().Str("store", d.roots.Store).Msg("store filesystem reflinks: clones and hibernates share RAM file extents")
	} else {
		d.log.Warn().Str("store", d.roots.Store).Msg("store filesystem cannot reflink: every clone, hibernate and wake copies the RAM file (sparse copy)")
	}
	if len(d.templates) == 0 {
		d.log.Warn().Msg("no templates: golden builds and cold boots will fail (run `make guest`)")
	}
	for _, name := range d.Templates() {
		g, err := d.guest(name)
		if err != nil {
			d.log.Warn().Err(err).Str("template", name).Msg("template unusable: its golden builds and cold boots will fail")
			continue
		}
		d.log.Info().Str("template", name).Str("kernel", g.Kernel).Str("initrd", g.Initrd).Str("disk", g.Disk).Msg("qemu template")
	}
	return rep, ctx.Err()
}

// Close ends the exit watches and leaves the VMs alone: they outlive the
// daemon, and the next start adopts them by pid file and cmdline.
func (d *Driver) Close() { d.unwatchAll() }

// Templates lists the names of the templates the driver serves, sorted: a
// pool or claim of another template cannot be served by this node.
func (d *Driver) Templates() []string {
	names := make([]string, 0, len(d.templates))
	for name := range d.templates {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// unknownTemplate is ErrUnknownTemplate naming what is served and how to
// build more.
func (d *Driver) unknownTemplate(template string) error {
	return fmt.Errorf("%w %s: served here: %v; `make guest` builds %s and %s, `executors/guest/template.sh %s` a template of that name (or set qemu.templates)", executors.ErrUnknownTemplate, template, d.Templates(), TemplateDefault, TemplateBusybox, template)
}

// guest returns what template boots; an unknown template or a missing file
// is an *executors.Unrecoverable naming what to run.
func (d *Driver) guest(template string) (Guest, error) {
	g, ok := d.templates[template]
	if !ok {
		return g, executors.AsUnrecoverable(d.unknownTemplate(template))
	}
	for _, f := range []struct{ what, path string }{{"kernel", g.Kernel}, {"initrd", g.Initrd}, {"disk", g.Disk}} {
		if f.path == "" && f.what == "disk" {
			continue
		}
		if f.path == "" {
			return g, executors.Unrecoverablef("qemu: template %s has no %s: run `make guest` (or set qemu.templates)", template, f.what)
		}
		if st, err := os.Stat(f.path); err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
			return g, executors.Unrecoverablef("qemu: template %s: %s %s is missing or empty (%v): run `make guest` (or set qemu.templates)", template, f.what, f.path, err)
		}
	}
	return g, nil
}

// bootSpec is the spec of a cold boot (golden build or cold clone) of pool k;
// an egress pool's machine gets the egress NIC (its backend is the
// caller's: a VM's tap, or none for a golden).
func (d *Driver) bootSpec(ctx context.Context, runDir, storeDir string, k fsm.PoolKey) (Spec, error) {
	if err := d.CheckPool(k, true); err != nil {
		return Spec{}, executors.AsUnrecoverable(fmt.Errorf("pool %s: %w", k, err))
	}
	z, err := d.sizes.Lookup(k.Size)
	if err != nil {
		return Spec{}, executors.AsUnrecoverable(err)
	}
	g, err := d.guest(k.Template)
	if err != nil {
		return Spec{}, err
	}
	spec := Spec{RunDir: runDir, StoreDir: storeDir, MemoryMiB: z.MemoryMiB, CPUs: z.CPUs, Kernel: g.Kernel, Initrd: g.Initrd, Disk: g.Disk, EgressNIC: k.Net == NetEgress}
	if g.Disk != "" {
		spec.Append = RootAppend
	}
	accel, _ := d.q.Accel(ctx, spec)
	t, capped := d.sizeUnder(z, accel)
	if capped {
		if _, logged := d.capped.LoadOrStore(k.Size, struct{}{}); !logged {
			d.log.Info().Str("size", k.Size).Int("memory_mib", z.MemoryMiB/2).Int("cap_mib", d.tcgMax).Msg("TCG: memory capped")
		}
	}
	spec.MemoryMiB, spec.CPUs = t.MemoryMiB, t.CPUs
	return spec, nil
}

// sizeUnder is what a VM of size z gets under accel; it reports whether
// the TCG cap cut its memory.
func (d *Driver) sizeUnder(z Size, accel Accel) (Size, bool) {
	if accel != AccelTCG {
		return z, false
	}
	return z.underTCG(d.tcgMax)
}

// VMSize is what a VM of pool size name gets on this driver, as bootSpec
// launches it: the size table's row, scaled under TCG. The API reports it
// as a sandbox's cpu_count and mem_total_bytes (api.VMSizer). Until the
// accelerator is known (AccelAuto before the first boot probed it) it is
// the row as is; no VM exists before that boot.
func (d *Driver) VMSize(name string) (fsm.Size, bool) {
	z, err := d.sizes.Lookup(name)
	if err != nil {
		return fsm.Size{}, false
	}
	t, _ := d.sizeUnder(z, d.q.knownAccel())
	return fsm.Size{Name: name, VCPUs: t.CPUs, MemoryMiB: t.MemoryMiB}, true
}

// report turns a recipe's result into the result event's report.
func (d *Driver) report(r RecipeResult, extra ...event.Step) event.ExecReport {
	var rep event.ExecReport
	for _, s := range r.Steps {
		rep.Steps = append(rep.Steps, event.Step{Name: s.Name, NS: int64(s.Dur)})
	}
	rep.Steps = append(rep.Steps, extra...)
	switch {
	case r.Method != 0:
		rep.CopyMode = r.Method.String()
	case r.Already:
		// The attempt that did the work cloned on this same store.
		if m := fsx.Method(d.copyMode.Load()); m != 0 {
			rep.CopyMode = m.String()
		}
	}
	return rep
}

// classify maps the recipes' errors to the executors' classes.
func classify(err error) error {
	switch {
	case err == nil, executors.IsUnrecoverable(err):
		return err
	case executors.IsCapacity(err):
		return executors.Capacity(err)
	case errors.Is(err, ErrInvalidSpec), errors.Is(err, ErrSnapshotExists):
		return executors.AsUnrecoverable(err)
	}
	return err
}

// checkSnapshot reports whether dir holds a complete snapshot: meta.json
// readable, the RAM file as large as the memory it records, the state file
// as large as the migration stream it records, and a disk's backing file present.
func checkSnapshot(dir string) (Meta, error) {
	m, err := ReadMeta(dir)
	if err != nil {
		return m, err
	}
	for _, f := range []struct {
		name string
		size int64
	}{{FileRAM, int64(m.MemoryMiB) << 20}, {FileState, m.StateBytes}} {
		st, err := os.Stat(filepath.Join(dir, f.name))
		if err != nil {
			return m, fmt.Errorf("%w: %s: %v", ErrNoSnapshot, dir, err)
		}
		if st.Size() != f.size {
			return m, fmt.Errorf("%w: %s/%s is %d bytes, meta.json says %d", ErrNoSnapshot, dir, f.name, st.Size(), f.size)
		}
	}
	if m.Disk {
		// The disk's backing file (a template's rootfs.img) is outside the
		// store: a rebuilt or removed template leaves the snapshot unusable.
		backing, err := qcow2Backing(filepath.Join(dir, FileDisk))
		if err != nil {
			return m, fmt.Errorf("%w: %v", ErrNoSnapshot, err)
		}
		if backing != "" {
			if _, err := os.Stat(backing); err != nil {
				return m, fmt.Errorf("%w: %s: the disk's backing file is gone: %v", ErrNoSnapshot, dir, err)
			}
		}
	}
	return m, nil
}

// cleanup runs rollback work on a context that survives the recipe's
// cancellation (a timeout or shutdown mid-recipe still rolls back).
func (d *Driver) cleanup(ctx context.Context, what string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.resumeTO)
	defer cancel()
	if err := fn(ctx); err != nil {
		d.log.Warn().Err(err).Str("action", what).Msg("rollback action failed; a re-run or the start-up sweep finishes it")
	}
}
