package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

// RecipesConfig configures Recipes. Zero values take the defaults named per field.
type RecipesConfig struct {
	// QEMU is the emulator binary (default "qemu-system-x86_64").
	QEMU string
	// Accel is the accelerator for cold boots (default AccelAuto). Restores use the
	// accelerator recorded in the snapshot.
	Accel Accel
	// Machine is QEMU's machine type (default "pc").
	Machine string
	// FS performs every side effect on the run dir and the store (default
	// fsx.NewOS(Log)); tests wrap it in an fsx.Recorder.
	FS  fsx.FS
	Log zerolog.Logger
	// Now is the clock for step timings and snapshot metadata (default time.Now).
	Now func() time.Time

	// BootTimeout bounds a cold boot up to the agent's first answer (default 2 min:
	// TCG under load is slow).
	BootTimeout time.Duration
	// ReadyTimeout bounds the wait for the agent after a restore (default 30 s).
	ReadyTimeout time.Duration
	// StartTimeout bounds the wait for QMP after launching QEMU (default 30 s).
	StartTimeout time.Duration
	// MigrateTimeout bounds saving or loading the device state (default 2 min).
	MigrateTimeout time.Duration
	// StopGrace is how long each of quit, SIGTERM and SIGKILL is given (default 5 s).
	StopGrace time.Duration

	// Instance is recorded in every snapshot's meta.json, so a start-up
	// sweep removes only its own instance's snapshots.
	Instance string

	// ProbeTimeout bounds AccelAuto's KVM probe boot (default 10 s). Nested KVM
	// can hang forever, so the probe must give up fast and fall back to TCG.
	ProbeTimeout time.Duration
	// KVMDevice is checked before probing (default "/dev/kvm").
	KVMDevice string
	// Probe replaces the KVM probe boot (tests); nil means a real boot of the
	// spec's kernel and initrd under KVM that must reach agent ready.
	Probe func(ctx context.Context, spec Spec) error
	// StepHook, if set, is called as each step of a snapshot recipe ends
	// (recipe: the snapshot's source, "checkpoint", "promote",
	// "hibernate", "golden"; step: Step*): the SBX_CRASH_AT seam. QEMU's
	// steps are timed at their end, so the seam dies right after the
	// named step, before the next one.
	StepHook func(recipe, step string)
}

// Recipes runs the recipes (Boot, Golden, Clone, Hibernate, Wake, Resume,
// Destroy) on VMs described by a Spec, one QEMU process per VM. Its methods are
// safe for concurrent use on different VMs; calls for the same VM must not
// overlap (the state machine serialises them, through Driver).
type Recipes struct {
	qemu, machine string
	instance      string
	fs            fsx.FS
	log           zerolog.Logger
	now           func() time.Time

	bootTimeout, readyTimeout, startTimeout, migrateTimeout, stopGrace time.Duration
	probeTimeout                                                       time.Duration
	kvmDevice                                                          string
	probe                                                              func(ctx context.Context, spec Spec) error
	hook                                                               func(recipe, step string)

	accelMu  sync.Mutex
	accel    Accel // AccelAuto until resolved
	accelWhy string

	rearmMu sync.Mutex // one re-arming of a guest agent at a time (agentnet.go)
}

// children are the QEMU processes started by any Recipes of this process, each
// with a channel closed once reaped. Process-wide, because a child outlives the
// Recipes value that started it (a second one adopting it must still wait for the reap,
// or it would report a zombie as gone).
var children = struct {
	sync.Mutex
	m map[int]chan struct{}
}{m: make(map[int]chan struct{})}

// NewRecipes returns a Recipes.
func NewRecipes(cfg RecipesConfig) (*Recipes, error) {
	accel, err := ParseAccel(string(cfg.Accel))
	if err != nil {
		return nil, err
	}
	q := &Recipes{
		qemu:           or(cfg.QEMU, "qemu-system-x86_64"),
		machine:        or(cfg.Machine, "pc"),
		instance:       cfg.Instance,
		fs:             cfg.FS,
		log:            cfg.Log,
		now:            cfg.Now,
		bootTimeout:    orDur(cfg.BootTimeout, 2*time.Minute),
		readyTimeout:   orDur(cfg.ReadyTimeout, 30*time.Second),
		startTimeout:   orDur(cfg.StartTimeout, 30*time.Second),
		migrateTimeout: orDur(cfg.MigrateTimeout, 2*time.Minute),
		stopGrace:      orDur(cfg.StopGrace, 5*time.Second),
		probeTimeout:   orDur(cfg.ProbeTimeout, 10*time.Second),
		kvmDevice:      or(cfg.KVMDevice, "/dev/kvm"),
		probe:          cfg.Probe,
		hook:           cfg.StepHook,
		accel:          accel,
	}
	if q.fs == nil {
		q.fs = fsx.NewOS(cfg.Log)
	}
	if q.now == nil {
		q.now = time.Now
	}
	if q.probe == nil {
		q.probe = q.probeBoot
	}
	return q, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func orDur(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

// Accel returns the accelerator cold boots use, resolving AccelAuto on first use
// (with spec's kernel and initrd for the probe boot) and remembering the outcome,
// and a sentence saying why.
func (q *Recipes) Accel(ctx context.Context, spec Spec) (Accel, string) {
	q.accelMu.Lock()
	defer q.accelMu.Unlock()
	if q.accel != AccelAuto {
		if q.accelWhy == "" {
			q.accelWhy = "configured"
		}
		return q.accel, q.accelWhy
	}
	q.accel, q.accelWhy = q.resolveAuto(ctx, spec)
	q.log.Info().Str("accel", string(q.accel)).Str("why", q.accelWhy).Msg("qemu accelerator chosen")
	return q.accel, q.accelWhy
}

// knownAccel is the accelerator cold boots use, AccelAuto while auto has
// not been resolved yet; it never probes.
func (q *Recipes) knownAccel() Accel {
	q.accelMu.Lock()
	defer q.accelMu.Unlock()
	return q.accel
}

func (q *Recipes) resolveAuto(ctx context.Context, spec Spec) (Accel, string) {
	f, err := os.OpenFile(q.kvmDevice, os.O_RDWR, 0)
	if err != nil {
		return AccelTCG, fmt.Sprintf("auto: %s unusable (%v)", q.kvmDevice, err)
	}
	f.Close()
	pctx, cancel := context.WithTimeout(ctx, q.probeTimeout)
	defer cancel()
	start := q.now()
	if err := q.probe(pctx, spec); err != nil {
		return AccelTCG, fmt.Sprintf("auto: KVM probe boot failed after %s (%v)", q.now().Sub(start).Round(time.Millisecond), err)
	}
	return AccelKVM, fmt.Sprintf("auto: KVM probe boot answered in %s", q.now().Sub(start).Round(time.Millisecond))
}

// ProbeDirPrefix starts the name of the scratch run dir of a KVM probe boot, made
// next to the run dir of the boot that needed the probe. A crash can leave one
// behind (with its QEMU); Destroy of it cleans up.
const ProbeDirPrefix = ".kvm-probe-"

// probeBoot cold-boots spec's guest under KVM in a scratch run dir next to
// spec.RunDir and waits for the agent; the VM is destroyed either way.
func (q *Recipes) probeBoot(ctx context.Context, spec Spec) error {
	dir, err := os.MkdirTemp(filepath.Dir(spec.RunDir), ProbeDirPrefix)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	m := q.bootMeta(spec, AccelKVM)
	m.MemoryMiB = min(m.MemoryMiB, 256)
	// The initramfs's agent answers without the root disk, which the probe
	// dir does not have (Boot clones it later).
	m.Disk, m.Append = false, ""
	pid, c, err := q.launch(ctx, dir, m, false, nil)
	if err != nil {
		return err
	}
	defer func() {
		// The probe's context may be what expired; stopping needs its own.
		sctx, cancel := context.WithTimeout(context.Background(), 3*q.stopGrace)
		defer cancel()
		_ = q.terminate(sctx, pid, dir, c)
		c.Close()
	}()
	a, err := agent.WaitReady(ctx, AgentSocket(dir), 200*time.Millisecond)
	if err != nil {
		return err
	}
	return a.Close()
}

func (q *Recipes) bootMeta(spec Spec, accel Accel) Meta {
	return Meta{
		Format:    MetaFormat,
		Machine:   q.machine,
		Accel:     accel,
		MemoryMiB: spec.MemoryMiB,
		CPUs:      max(spec.CPUs, 1),
		Kernel:    spec.Kernel,
		Initrd:    spec.Initrd,
		Append:    spec.Append,
		Disk:      spec.Disk != "",
		AgentNet:  true,
		EgressNIC: spec.EgressNIC || spec.Egress != nil,
	}
}

// Step is one named step of a recipe and how long it took.
type Step struct {
	Name string
	Dur  time.Duration
}

// Step names.
const (
	StepPrepare  = "prepare"  // run dir created/cleared, disk cloned for a cold boot
	StepLaunch   = "launch"   // QEMU started, until QMP answered
	StepReady    = "ready"    // until the guest agent answered
	StepStop     = "stop"     // QMP stop (vCPUs paused)
	StepMigrate  = "migrate"  // device state saved to the snapshot's state file
	StepClone    = "clone"    // FICLONE (or copy) of RAM and disk
	StepMeta     = "meta"     // meta.json written
	StepSync     = "sync"     // SyncTree of the snapshot
	StepRename   = "rename"   // snapshot moved into place
	StepQuit     = "quit"     // QEMU told to quit, until the process was gone
	StepCleanup  = "cleanup"  // run dir removed
	StepIncoming = "incoming" // device state loaded with migrate-incoming
	StepCont     = "cont"     // QMP cont (vCPUs running)
)

// RecipeResult is what a recipe did.
type RecipeResult struct {
	Steps []Step
	// Method says how RAM (and disk) reached their destination: fsx.Reflink or
	// fsx.Copy; zero when the recipe cloned nothing.
	Method fsx.Method
	// CopiedBytes is how much data the clones physically copied (0 for reflinks).
	CopiedBytes int64
	// StateBytes is the size of the migration stream written or read.
	StateBytes int64
	// PID is the QEMU process after Boot, Clone and Wake.
	PID int
	// Already is set when the recipe found its effect in place and did nothing
	// (a re-run after a crash).
	Already bool
	// Accel is the accelerator the VM runs with (Boot, Clone, Wake).
	Accel Accel
	// ClockOffset is how far the guest's wall clock was from the host's
	// when the recipe set it (Boot, Clone, Wake, Resume; negative: behind).
	ClockOffset time.Duration
}

// Dur returns the duration of the named step (0 if it did not run).
func (r *RecipeResult) Dur(name string) time.Duration {
	var t time.Duration
	for _, s := range r.Steps {
		if s.Name == name {
			t += s.Dur
		}
	}
	return t
}

// Total is the sum of all steps.
func (r *RecipeResult) Total() time.Duration {
	var t time.Duration
	for _, s := range r.Steps {
		t += s.Dur
	}
	return t
}

// timer appends timed steps to a RecipeResult.
type timer struct {
	q    *Recipes
	r    *RecipeResult
	last time.Time
	// recipe names the steps for the StepHook ("": not called).
	recipe string
}

func (q *Recipes) timer(r *RecipeResult) *timer { return &timer{q: q, r: r, last: q.now()} }

// recipeTimer is a timer whose marks reach the StepHook as recipe's steps.
func (q *Recipes) recipeTimer(r *RecipeResult, recipe string) *timer {
	t := q.timer(r)
	t.recipe = recipe
	return t
}

// mark ends the current step: it lasted from the previous mark until now.
func (t *timer) mark(name string) {
	now := t.q.now()
	t.r.Steps = append(t.r.Steps, Step{Name: name, Dur: now.Sub(t.last)})
	t.last = now
	if t.recipe != "" && t.q.hook != nil {
		t.q.hook(t.recipe, name)
	}
}

// skip restarts the clock without recording (time spent outside any step).
func (t *timer) skip() { t.last = t.q.now() }

func (r *RecipeResult) addClone(res fsx.CloneResult) {
	if r.Method == 0 || res.Method == fsx.Copy {
		r.Method = res.Method
	}
	r.CopiedBytes += res.Bytes
}
