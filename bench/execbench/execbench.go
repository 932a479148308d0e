// Package execbench is the executors' benchmark section (`go run ./bench
// -only execbench`), measured on a loop-mounted XFS with reflink, with chsim
// as the VMM, side by side in one run:
//
//   - clones per second through the worker pool (scheduler.Scheduler
//     running the chdriver recipe in-process) against the old daemon's path, one fork+exec
//     of a CLI per clone (bench/execbench/cli: the same recipe in a new
//     process), at the same concurrency, in alternating rounds;
//   - hibernate and wake through the pool, each split by step category into
//     CH calls, VMM process start/stop, FICLONE, fsync, guest readiness, and
//     the control plane's own time (the rest of the wall time from Offer to
//     the result reaching the proposer).
//
// Targets (issue 5): at least 1.5x the comparator's clones per second; a
// hibernate's control-plane overhead under 5 ms at the median. Needs root
// (loop mount), xfsprogs and the go tool (to build chsim and the CLI).
package execbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
	"github.com/sbxlog/sbxlog/executors/chdriver"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/scheduler"
	"github.com/sbxlog/sbxlog/fsm"
)

const instance = "bench"

var key = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

// config sizes one run.
type config struct {
	rounds int // alternating pool/CLI rounds
	clones int // clones per round and path
	cycles int // hibernate/wake cycles
}

func configFor(quick bool) config {
	if quick {
		return config{rounds: 2, clones: 8, cycles: 4}
	}
	// Short alternating rounds: a noisy host slows both paths alike.
	return config{rounds: 8, clones: 30, cycles: 30}
}

// Run measures the section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := configFor(opts.Quick)
	if os.Geteuid() != 0 {
		return nil, errors.New("execbench: needs root to loop-mount XFS")
	}
	for _, tool := range []string{"mkfs.xfs", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("execbench: %s not found (apt-get install xfsprogs)", tool)
		}
	}
	bin := filepath.Join(opts.Scratch, "execbench-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, err
	}
	chsim, err := chsimbin.Build(bin)
	if err != nil {
		return nil, err
	}
	cli := filepath.Join(bin, "sbxclone")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", cli, "github.com/sbxlog/sbxlog/bench/execbench/cli").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("execbench: build the CLI comparator: %v: %s", err, out)
	}
	mnt, unmount, err := mountXFS(ctx, opts.Scratch, 4<<30)
	if err != nil {
		return nil, err
	}
	defer func() { _ = unmount() }()

	b, err := newBench(ctx, filepath.Join(mnt, "d"), chsim)
	if err != nil {
		return nil, err
	}
	defer b.close()
	golden, err := b.golden(ctx)
	if err != nil {
		return nil, err
	}

	// Warm both paths up (page cache of the binaries, the golden's pages,
	// the filesystem's allocator), untimed.
	if _, _, err := b.poolClones(ctx, golden, scheduler.DefaultConcurrency()); err != nil {
		return nil, err
	}
	if _, _, err := b.cliClones(ctx, cli, golden, scheduler.DefaultConcurrency()); err != nil {
		return nil, err
	}
	var poolLat, cliLat report.Durations
	var poolWall, cliWall time.Duration
	n := 0
	for r := 0; r < cfg.rounds; r++ {
		lat, wall, err := b.poolClones(ctx, golden, cfg.clones)
		if err != nil {
			return nil, err
		}
		poolLat, poolWall = append(poolLat, lat...), poolWall+wall
		lat, wall, err = b.cliClones(ctx, cli, golden, cfg.clones)
		if err != nil {
			return nil, err
		}
		cliLat, cliWall = append(cliLat, lat...), cliWall+wall
		n += cfg.clones
	}
	hib, wake, err := b.cycles(ctx, golden, cfg.cycles)
	if err != nil {
		return nil, err
	}

	conc := scheduler.DefaultConcurrency()
	sec := &report.Section{
		Title: "Executors: clone throughput (worker pool vs CLI per clone), hibernate and wake split",
		Method: fmt.Sprintf("chsim VMMs (the CH API simulator; small = 1 vCPU, 512 MiB, %d MiB of guest data) on a 4 GiB "+
			"loop-mounted XFS with reflink (store copy mode: %s). Clones: %d rounds, each %d clones through scheduler.Scheduler "+
			"(the chdriver recipe in-process, %d at a time) then %d clones by forking bench/execbench/cli once per clone "+
			"(the same recipe in a new process: the old daemon's CLI-per-op path), %d at a time, after an untimed warm-up "+
			"batch of each; clones/s is clones over "+
			"the wall time of the batch, VMs destroyed (untimed) after each batch; per-clone time is dispatch to result for "+
			"the pool and process start to exit for the CLI. Hibernate/wake: %d cycles of one VM through the pool, timed "+
			"from Offer to the result reaching the proposer (an in-memory proposer: the op log append is measured by "+
			"logbench), split by step category from the result's ExecReport; control plane = wall - (CH calls + VMM "+
			"start/stop + FICLONE + fsync + guest probe), i.e. queueing, recipe bookkeeping, metadata and other "+
			"filesystem work.", chsimDirty>>20, b.copyMode, cfg.rounds, cfg.clones, conc, cfg.clones, conc, cfg.cycles),
		Header: []string{"measure", "samples", "p50", "p99", "rate / share of p50"},
	}
	poolRate := float64(n) / poolWall.Seconds()
	cliRate := float64(n) / cliWall.Seconds()
	sec.AddRow("clone, worker pool", len(poolLat), report.Fmt(poolLat.Quantile(0.5)), report.Fmt(poolLat.Quantile(0.99)), fmt.Sprintf("%.1f clones/s", poolRate))
	sec.AddRow("clone, CLI fork+exec per clone", len(cliLat), report.Fmt(cliLat.Quantile(0.5)), report.Fmt(cliLat.Quantile(0.99)), fmt.Sprintf("%.1f clones/s", cliRate))
	hib.rows(sec, "hibernate")
	wake.rows(sec, "wake")
	ratio := poolRate / cliRate
	sec.Verdict(ratio >= 1.5, "worker pool %.1f clones/s vs CLI per clone %.1f clones/s: %.2fx (target >= 1.5x)", poolRate, cliRate, ratio)
	cp := hib.parts[partControl].Quantile(0.5)
	sec.Verdict(cp < 5*time.Millisecond, "hibernate control-plane overhead p50 %s (target < 5 ms)", report.Fmt(cp))
	sec.Notes = append(sec.Notes,
		"The seeds' old daemon measured 155-180 clones/s through its CLI against 257-274/s direct (1.5-1.7x) on a 22-vCPU host.",
		fmt.Sprintf("Store copy mode %s: every clone's and hibernate's cow.raw is a FICLONE.", b.copyMode))
	return sec, nil
}

// chsimDirty is the data a booted chsim guest holds (what snapshots write).
const chsimDirty = 4 << 20

type stamped struct {
	cmd fsm.Command
	at  time.Time
}

// proposer is an in-memory Proposer that hands results to the bench.
type proposer chan stamped

func (p proposer) Propose(_ context.Context, cmd fsm.Command) error {
	p <- stamped{cmd, time.Now()}
	return nil
}

// observer collects per-op durations of clones.
type observer struct {
	scheduler.NopObserver
	mu     sync.Mutex
	clones report.Durations
}

func (o *observer) OpDone(k fsm.IntentKind, out scheduler.Outcome, d time.Duration) {
	if k == fsm.KindClone && out == scheduler.OutcomeDone {
		o.mu.Lock()
		o.clones = append(o.clones, d)
		o.mu.Unlock()
	}
}

func (o *observer) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.clones)
}

func (o *observer) takeClones() report.Durations {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.clones
	o.clones = nil
	return out
}

type bench struct {
	data, chsim string
	drv         *chdriver.Driver
	pool        *scheduler.Scheduler
	props       proposer
	obs         *observer
	copyMode    fsx.Method
	seq         int
	live        map[string]bool
}

func newBench(ctx context.Context, data, chsim string) (*bench, error) {
	drv, err := chdriver.New(chdriver.Config{
		Roots: layout.RootsIn(data), Instance: instance, VMM: chsim, Hypervisor: chdriver.CHSim,
		VMMEnv: []string{fmt.Sprintf("SBX_CHSIM_DIRTY_BYTES=%d", chsimDirty)},
		Log:    zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	})
	if err != nil {
		return nil, err
	}
	rep, err := drv.Prepare(ctx)
	if err != nil {
		return nil, err
	}
	b := &bench{data: data, chsim: chsim, drv: drv, props: make(proposer, 1024), obs: &observer{}, copyMode: rep.CopyMode, live: map[string]bool{}}
	b.pool = scheduler.New(drv, b.props, scheduler.Options{Observer: b.obs, Log: zerolog.New(os.Stderr).Level(zerolog.WarnLevel)})
	return b, nil
}

// close destroys every VM still running and stops the pool.
func (b *bench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = b.destroyAll(ctx)
	_ = b.pool.Shutdown(ctx)
	b.drv.Close()
}

func (b *bench) nextVM() string {
	b.seq++
	return fmt.Sprintf("vm-%016x", b.seq)
}

// wait returns the next n results, failing on a failure command.
func (b *bench) wait(ctx context.Context, n int) ([]stamped, error) {
	var out []stamped
	for len(out) < n {
		select {
		case s := <-b.props:
			switch c := s.cmd.(type) {
			case fsm.VMCloneFailed:
				return nil, fmt.Errorf("execbench: clone %s failed: %s", c.VM, c.Error)
			case fsm.GoldenFailed:
				return nil, fmt.Errorf("execbench: golden failed: %s", c.Error)
			case fsm.HibernateFailed:
				return nil, fmt.Errorf("execbench: hibernate %s failed: %s", c.VM, c.Error)
			case fsm.WakeFailed:
				return nil, fmt.Errorf("execbench: wake %s failed: %s", c.VM, c.Error)
			case fsm.CapacityFull:
				return nil, errors.New("execbench: store full")
			}
			out = append(out, s)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Minute):
			return nil, errors.New("execbench: no result for 2 minutes")
		}
	}
	return out, nil
}

func (b *bench) golden(ctx context.Context) (string, error) {
	b.pool.Offer([]fsm.Intent{fsm.BuildGolden{OpID: ulid.Make(), Key: key}})
	res, err := b.wait(ctx, 1)
	if err != nil {
		return "", err
	}
	g, ok := res[0].cmd.(fsm.GoldenBuilt)
	if !ok {
		return "", fmt.Errorf("execbench: golden: got %T", res[0].cmd)
	}
	return g.SnapshotDir, nil
}

func (b *bench) cloneIntent(vm, golden string, seq int) fsm.CloneVM {
	return fsm.CloneVM{OpID: ulid.Make(), VM: vm, Key: key, Instance: instance, RunDir: instance + "/" + vm, GoldenDir: golden, ReqSeq: uint64(seq)}
}

// poolClones clones n VMs through the pool, all offered at once.
func (b *bench) poolClones(ctx context.Context, golden string, n int) (report.Durations, time.Duration, error) {
	var ins []fsm.Intent
	for i := 0; i < n; i++ {
		vm := b.nextVM()
		b.live[vm] = true
		ins = append(ins, b.cloneIntent(vm, golden, i))
	}
	b.obs.takeClones()
	start := time.Now()
	b.pool.Offer(ins)
	if _, err := b.wait(ctx, n); err != nil {
		return nil, 0, err
	}
	wall := time.Since(start)
	// OpDone follows the proposal by moments; wait for every sample.
	for deadline := time.Now().Add(5 * time.Second); b.obs.count() < n && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	lat := b.obs.takeClones()
	return lat, wall, b.destroyAll(ctx)
}

// cliClones clones n VMs by running the CLI once per clone, conc at a time.
func (b *bench) cliClones(ctx context.Context, cli, golden string, n int) (report.Durations, time.Duration, error) {
	conc := scheduler.DefaultConcurrency()
	sem := make(chan struct{}, conc)
	var mu sync.Mutex
	var lat report.Durations
	var errs []error
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		vm := b.nextVM()
		b.live[vm] = true
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			cmd := exec.CommandContext(ctx, cli, "-data", b.data, "-instance", instance, "-vmm", b.chsim, "-vm", vm, "-golden", golden)
			cmd.Env = append(os.Environ(), fmt.Sprintf("SBX_CHSIM_DIRTY_BYTES=%d", chsimDirty))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("cli clone %s: %v: %s", vm, err, strings.TrimSpace(stderr.String())))
				return
			}
			lat = append(lat, d)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	return lat, wall, b.destroyAll(ctx)
}

// destroyAll destroys every live VM through the pool.
func (b *bench) destroyAll(ctx context.Context) error {
	var ins []fsm.Intent
	for vm := range b.live {
		ins = append(ins, fsm.DestroyVM{OpID: ulid.Make(), VM: vm, Key: key, Instance: instance, RunDir: instance + "/" + vm})
	}
	if len(ins) == 0 {
		return nil
	}
	b.pool.Offer(ins)
	_, err := b.wait(ctx, len(ins))
	b.live = map[string]bool{}
	return err
}

// Parts of an operation's time.
const (
	partTotal = iota
	partCH
	partVMM
	partClone
	partFsync
	partGuest
	partControl
	numParts
)

var partNames = [numParts]string{"total", "CH calls", "VMM start/stop", "FICLONE", "fsync", "guest probe", "control plane"}

// split accumulates the parts of one kind of operation.
type split struct{ parts [numParts]report.Durations }

func (s *split) add(wall time.Duration, rep *event.ExecReport) {
	var by [numParts]time.Duration
	if rep != nil {
		for _, st := range rep.Steps {
			d := time.Duration(st.NS)
			switch chdriver.StepCategory(st.Name) {
			case chdriver.CatCH:
				by[partCH] += d
			case chdriver.CatVMM:
				by[partVMM] += d
			case chdriver.CatClone:
				by[partClone] += d
			case chdriver.CatFsync:
				by[partFsync] += d
			case chdriver.CatGuest:
				by[partGuest] += d
			}
		}
	}
	by[partTotal] = wall
	by[partControl] = wall - by[partCH] - by[partVMM] - by[partClone] - by[partFsync] - by[partGuest]
	for i := range by {
		s.parts[i] = append(s.parts[i], by[i])
	}
}

func (s *split) rows(sec *report.Section, op string) {
	total := s.parts[partTotal].Quantile(0.5)
	for i := 0; i < numParts; i++ {
		p50 := s.parts[i].Quantile(0.5)
		share := ""
		if i != partTotal && total > 0 {
			share = fmt.Sprintf("%.0f%%", 100*float64(p50)/float64(total))
		}
		sec.AddRow(op+": "+partNames[i], len(s.parts[i]), report.Fmt(p50), report.Fmt(s.parts[i].Quantile(0.99)), share)
	}
}

// cycles hibernates and wakes one VM n times through the pool.
func (b *bench) cycles(ctx context.Context, golden string, n int) (*split, *split, error) {
	vm := b.nextVM()
	b.live[vm] = true
	b.pool.Offer([]fsm.Intent{b.cloneIntent(vm, golden, 0)})
	if _, err := b.wait(ctx, 1); err != nil {
		return nil, nil, err
	}
	hib, wake := &split{}, &split{}
	runDir := instance + "/" + vm
	var snap string
	for i := 0; i < n; i++ {
		start := time.Now()
		b.pool.Offer([]fsm.Intent{fsm.HibernateVM{OpID: ulid.Make(), VM: vm, Key: key, RunDir: runDir, ReqSeq: uint64(i)}})
		res, err := b.wait(ctx, 1)
		if err != nil {
			return nil, nil, err
		}
		hd, ok := res[0].cmd.(fsm.HibernateDone)
		if !ok {
			return nil, nil, fmt.Errorf("execbench: hibernate: got %T", res[0].cmd)
		}
		hib.add(res[0].at.Sub(start), hd.Report)
		snap = hd.SnapshotDir

		start = time.Now()
		b.pool.Offer([]fsm.Intent{fsm.WakeVM{OpID: ulid.Make(), VM: vm, Key: key, RunDir: runDir, SnapshotDir: snap, ReqSeq: uint64(i)}})
		if res, err = b.wait(ctx, 1); err != nil {
			return nil, nil, err
		}
		wd, ok := res[0].cmd.(fsm.WakeDone)
		if !ok {
			return nil, nil, fmt.Errorf("execbench: wake: got %T", res[0].cmd)
		}
		wake.add(res[0].at.Sub(start), wd.Report)
	}
	return hib, wake, nil
}

// mountXFS makes a size-byte XFS image with reflink under dir and
// loop-mounts it; the returned func unmounts it and removes the image.
func mountXFS(ctx context.Context, dir string, size int64) (string, func() error, error) {
	base, err := os.MkdirTemp(dir, "execbench-xfs-")
	if err != nil {
		return "", nil, err
	}
	img, mnt := filepath.Join(base, "fs.img"), filepath.Join(base, "mnt")
	cleanup := func() { _ = os.RemoveAll(base) }
	if err := os.Mkdir(mnt, 0o755); err != nil {
		cleanup()
		return "", nil, err
	}
	if err := os.WriteFile(img, nil, 0o600); err == nil {
		err = os.Truncate(img, size)
	}
	if err != nil {
		cleanup()
		return "", nil, err
	}
	for _, argv := range [][]string{{"mkfs.xfs", "-q", "-m", "reflink=1", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			cleanup()
			return "", nil, fmt.Errorf("execbench: %s: %v: %s", argv[0], err, strings.TrimSpace(string(out)))
		}
	}
	return mnt, func() error {
		defer cleanup()
		var err error
		for i := 0; i < 50; i++ {
			var out []byte
			if out, err = exec.Command("umount", mnt).CombinedOutput(); err == nil || !strings.Contains(string(out), "busy") {
				break
			}
			time.Sleep(100 * time.Millisecond) // VMMs just killed still closing files
		}
		if err != nil {
			return exec.Command("umount", "-l", mnt).Run()
		}
		return nil
	}, nil
}
