// Package chbench is the benchmark section for the Cloud Hypervisor boundary:
// the VMM process manager (executors/vmm) and the CH client (executors/ch)
// driving chsim processes, since CH itself cannot run on these machines.
//
// It measures VMM launch to first vmm.ping, pause+snapshot+shutdown and
// restore+resume round trips, and clones per second through
// launch+restore(CopyOnWrite)+resume at concurrency 1, 8 and 32. The floor,
// measured in the same run, is fork+exec+exit of the same binary: no VMM
// start can be cheaper than starting its process.
package chbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
	"github.com/sbxlog/sbxlog/executors/vmm"
)

// Targets the verdicts check.
const (
	// OldDirectClonesPerSec is the old daemon's clone rate without its CLI
	// (257–274/s measured on its host); the CH boundary alone must sustain
	// at least that, or the control plane above it cannot.
	OldDirectClonesPerSec = 274
	// LaunchOverFloor bounds launch-to-ping against a bare fork+exec+exit of
	// the binary: the socket setup and our polling may add at most this
	// factor.
	LaunchOverFloor = 3.0
)

const (
	memSize = 256 << 20
	grace   = 2 * time.Second
)

type counts struct {
	launches, roundTrips, floor int
	clones                      map[int]int
}

// Run measures the section. opts.Scratch holds every run dir and snapshot.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	n := counts{launches: 200, roundTrips: 40, floor: 200, clones: map[int]int{1: 64, 8: 128, 32: 192}}
	if opts.Quick {
		n = counts{launches: 20, roundTrips: 5, floor: 20, clones: map[int]int{1: 8, 8: 16, 32: 32}}
	}
	root := filepath.Join(opts.Scratch, "chbench")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	bin, err := chsimbin.Build(root)
	if err != nil {
		return nil, err
	}
	b := &bench{root: root, bin: bin}
	sec := &report.Section{
		Title: "Cloud Hypervisor boundary (VMM process manager + CH client, against chsim)",
		Method: fmt.Sprintf("Each VMM is a chsim process (the CH API simulator; cloud-hypervisor cannot run here) "+
			"started by executors/vmm.Launch with only --api-socket, in its own process group, and driven by the "+
			"executors/ch client over its unix socket. Guests have %d MiB of memory (sparse) with chsim's default %d MiB "+
			"of dirty data. Launch is timed from fork to the first answered vmm.ping (%d launches); the round trips "+
			"from a running VM (%d each); a clone is: hard-link the golden's memory-ranges, copy state.json, write "+
			"config.json with the clone's disk and vsock paths, launch, vm.restore CopyOnWrite, vm.resume. The floor "+
			"is fork+exec+exit of the same binary (chsim --version), at the same concurrency. Snapshot files are on %s.",
			memSize>>20, chsim.DefaultDirtyBytes>>20, n.launches, n.roundTrips, fsName(root)),
		Header: []string{"measure", "concurrency", "n", "p50", "p99", "rate", "floor p50", "floor rate", "vs floor"},
	}

	floor1, err := b.floor(ctx, 1, n.floor)
	if err != nil {
		return nil, err
	}
	launch, err := b.launches(ctx, n.launches)
	if err != nil {
		return nil, err
	}
	lp50, fp50 := launch.Quantile(0.5), floor1.lat.Quantile(0.5)
	sec.AddRow("launch → first vmm.ping", 1, len(launch), report.Fmt(lp50), report.Fmt(launch.Quantile(0.99)),
		"", report.Fmt(fp50), "", fmt.Sprintf("%.2fx", ratio(lp50, fp50)))

	golden, hib, wake, err := b.roundTrips(ctx, n.roundTrips)
	if err != nil {
		return nil, err
	}
	sec.AddRow("pause + snapshot + shutdown", 1, len(hib), report.Fmt(hib.Quantile(0.5)), report.Fmt(hib.Quantile(0.99)), "", "", "", "")
	sec.AddRow("restore (CopyOnWrite) + resume", 1, len(wake), report.Fmt(wake.Quantile(0.5)), report.Fmt(wake.Quantile(0.99)), "", "", "", "")

	var rate8 float64
	var cpu8 rateResult
	var floorCPU time.Duration
	for _, c := range []int{1, 8, 32} {
		fl, err := b.floor(ctx, c, n.clones[c])
		if err != nil {
			return nil, err
		}
		cl, err := b.clones(ctx, golden, c, n.clones[c])
		if err != nil {
			return nil, err
		}
		if c == 8 {
			rate8, cpu8, floorCPU = cl.rate, cl, fl.childCPU
		}
		sec.AddRow("clone: launch + restore + resume", c, len(cl.lat), report.Fmt(cl.lat.Quantile(0.5)), report.Fmt(cl.lat.Quantile(0.99)),
			fmt.Sprintf("%.0f/s", cl.rate), report.Fmt(fl.lat.Quantile(0.5)), fmt.Sprintf("%.0f/s", fl.rate),
			fmt.Sprintf("%.0f%% of floor rate", 100*cl.rate/fl.rate))
	}
	sec.Verdict(ratio(lp50, fp50) <= LaunchOverFloor, "launch→ping p50 %s is %.2fx the fork+exec floor %s (target <= %.1fx)",
		report.Fmt(lp50), ratio(lp50, fp50), report.Fmt(fp50), LaunchOverFloor)
	sec.Verdict(rate8 >= OldDirectClonesPerSec, "clones through launch+restore+resume at concurrency 8: %.0f/s (target >= %d/s, the old daemon's direct rate)",
		rate8, OldDirectClonesPerSec)
	sec.Notes = append(sec.Notes, fmt.Sprintf("CPU per clone at concurrency 8: %s in the launching process (process manager, client, clone files), "+
		"%s in the VMM process (chsim, over its whole life in the run); a bare fork+exec+exit of the binary costs %s.",
		report.Fmt(cpu8.selfCPU), report.Fmt(cpu8.childCPU), report.Fmt(floorCPU)))
	sec.Notes = append(sec.Notes, "chsim restores CopyOnWrite by mapping memory-ranges MAP_PRIVATE (O(1) in memory size, the guest touches its pages once it runs); "+
		"real CH would spend its time creating vCPUs and devices instead, so these are figures for the process manager and client, "+
		"not for CH itself.")
	if opts.Quick {
		sec.Notes = append(sec.Notes, "quick run: small sample counts, not figures of record")
	}
	return sec, nil
}

type bench struct {
	root string
	bin  string
	seq  int
	mu   sync.Mutex
}

func (b *bench) dir(prefix string) (string, error) {
	b.mu.Lock()
	b.seq++
	d := filepath.Join(b.root, fmt.Sprintf("%s%d", prefix, b.seq))
	b.mu.Unlock()
	return d, os.MkdirAll(d, 0o755)
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

type rateResult struct {
	lat  report.Durations
	rate float64
	// CPU per operation: this process (process manager and client) and its
	// reaped children (the VMMs, or the floor's execs).
	selfCPU, childCPU time.Duration
}

// cpuNow is the CPU time used so far by this process and by its reaped
// children.
func cpuNow() (self, children time.Duration) {
	var s, c unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &s)
	_ = unix.Getrusage(unix.RUSAGE_CHILDREN, &c)
	tv := func(t unix.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(s.Utime) + tv(s.Stime), tv(c.Utime) + tv(c.Stime)
}

// parallel runs fn n times on c workers and times each call and the whole.
func parallel(ctx context.Context, c, n int, fn func(i int) error) (rateResult, error) {
	lat := make(report.Durations, n)
	idx := make(chan int)
	errs := make(chan error, c)
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				t := time.Now()
				if err := fn(i); err != nil {
					errs <- err
					return
				}
				lat[i] = time.Since(t)
			}
		}()
	}
	var err error
feed:
	for i := range n {
		select {
		case idx <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(idx)
	wg.Wait()
	elapsed := time.Since(start)
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	if err != nil {
		return rateResult{}, err
	}
	return rateResult{lat: lat, rate: float64(n) / elapsed.Seconds()}, nil
}

// floor is fork+exec+exit of the VMM binary.
func (b *bench) floor(ctx context.Context, c, n int) (rateResult, error) {
	self0, child0 := cpuNow()
	r, err := parallel(ctx, c, n, func(int) error {
		return exec.CommandContext(ctx, b.bin, "--version").Run()
	})
	self1, child1 := cpuNow()
	r.selfCPU, r.childCPU = (self1-self0)/time.Duration(n), (child1-child0)/time.Duration(n)
	return r, err
}

func (b *bench) launches(ctx context.Context, n int) (report.Durations, error) {
	var out report.Durations
	for range n {
		d, err := b.dir("l")
		if err != nil {
			return nil, err
		}
		t := time.Now()
		p, err := vmm.Launch(ctx, vmm.Config{Binary: b.bin, RunDir: d})
		if err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
		if _, err := p.Terminate(ctx, grace); err != nil {
			return nil, err
		}
		_ = os.RemoveAll(d)
	}
	return out, nil
}

// guestConfig is a VM whose kernel, disk and vsock live in dir.
func guestConfig(dir string) (*ch.VmConfig, error) {
	kernel, disk := filepath.Join(dir, "vmlinux"), filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(kernel, []byte("kernel"), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		return nil, err
	}
	if err := os.Truncate(disk, 64<<20); err != nil {
		return nil, err
	}
	cfg := ch.NewConfig(ch.Payload{Kernel: kernel, Cmdline: "console=ttyS0"}, 1, memSize)
	cfg.AddDisk(disk)
	cfg.SetVsock(3, filepath.Join(dir, "vsock.sock"))
	return cfg, nil
}

// roundTrips times pause+snapshot+shutdown of a running VM and
// restore+resume of its snapshot in a fresh VMM; the first snapshot is kept
// as the golden for the clones.
func (b *bench) roundTrips(ctx context.Context, n int) (golden string, hib, wake report.Durations, err error) {
	for i := range n {
		d, err := b.dir("rt")
		if err != nil {
			return "", nil, nil, err
		}
		cfg, err := guestConfig(d)
		if err != nil {
			return "", nil, nil, err
		}
		p, err := vmm.Launch(ctx, vmm.Config{Binary: b.bin, RunDir: filepath.Join(d, "run")})
		if err != nil {
			return "", nil, nil, err
		}
		c := p.Client()
		if err := c.Create(ctx, cfg); err != nil {
			return "", nil, nil, err
		}
		if err := c.Boot(ctx); err != nil {
			return "", nil, nil, err
		}
		snap := filepath.Join(d, "snap")
		if err := os.Mkdir(snap, 0o755); err != nil {
			return "", nil, nil, err
		}
		url, _ := ch.FileURL(snap)
		t := time.Now()
		if err := c.Pause(ctx); err != nil {
			return "", nil, nil, err
		}
		if err := c.Snapshot(ctx, url); err != nil {
			return "", nil, nil, err
		}
		if err := c.Shutdown(ctx); err != nil {
			return "", nil, nil, err
		}
		hib = append(hib, time.Since(t))
		if _, err := p.Terminate(ctx, grace); err != nil {
			return "", nil, nil, err
		}

		p, err = vmm.Launch(ctx, vmm.Config{Binary: b.bin, RunDir: filepath.Join(d, "run")})
		if err != nil {
			return "", nil, nil, err
		}
		t = time.Now()
		if err := p.Client().Restore(ctx, ch.RestoreConfig{SourceURL: url, MemoryRestoreMode: ch.RestoreCopyOnWrite}); err != nil {
			return "", nil, nil, err
		}
		if err := p.Client().Resume(ctx); err != nil {
			return "", nil, nil, err
		}
		wake = append(wake, time.Since(t))
		if _, err := p.Terminate(ctx, grace); err != nil {
			return "", nil, nil, err
		}
		if i == 0 {
			golden = snap
		} else {
			_ = os.RemoveAll(d)
		}
	}
	return golden, hib, wake, nil
}

// clones runs n clones of golden on c workers; all VMMs stay up until the
// measurement ends, as warm VMs would.
func (b *bench) clones(ctx context.Context, golden string, c, n int) (rateResult, error) {
	data, err := os.ReadFile(filepath.Join(golden, chsim.ConfigFile))
	if err != nil {
		return rateResult{}, err
	}
	base, err := ch.ParseConfig(data)
	if err != nil {
		return rateResult{}, err
	}
	state, err := os.ReadFile(filepath.Join(golden, chsim.StateFile))
	if err != nil {
		return rateResult{}, err
	}
	self0, child0 := cpuNow()
	procs := make([]*vmm.Process, n)
	dirs := make([]string, n)
	for i := range dirs {
		if dirs[i], err = b.dir(fmt.Sprintf("c%d-", c)); err != nil {
			return rateResult{}, err
		}
	}
	res, err := parallel(ctx, c, n, func(i int) error {
		d := dirs[i]
		snap := filepath.Join(d, "snap")
		if err := os.Mkdir(snap, 0o755); err != nil {
			return err
		}
		if err := os.Link(filepath.Join(golden, chsim.MemoryFile), filepath.Join(snap, chsim.MemoryFile)); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(snap, chsim.StateFile), state, 0o600); err != nil {
			return err
		}
		cfg := base.Clone()
		disk := filepath.Join(d, "cow.raw")
		if err := os.WriteFile(disk, nil, 0o644); err != nil {
			return err
		}
		if err := cfg.SetDiskPath(0, disk); err != nil {
			return err
		}
		if err := cfg.SetVsockSocket(filepath.Join(d, "vsock.sock")); err != nil {
			return err
		}
		cdata, _ := cfg.MarshalJSON()
		if err := os.WriteFile(filepath.Join(snap, chsim.ConfigFile), cdata, 0o600); err != nil {
			return err
		}
		p, err := vmm.Launch(ctx, vmm.Config{Binary: b.bin, RunDir: filepath.Join(d, "run")})
		if err != nil {
			return err
		}
		procs[i] = p
		url, _ := ch.FileURL(snap)
		if err := p.Client().Restore(ctx, ch.RestoreConfig{SourceURL: url, MemoryRestoreMode: ch.RestoreCopyOnWrite}); err != nil {
			return err
		}
		return p.Client().Resume(ctx)
	})
	self1, _ := cpuNow()
	var wg sync.WaitGroup
	for i, p := range procs {
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = p.Terminate(ctx, grace)
			_ = os.RemoveAll(dirs[i])
		}()
	}
	wg.Wait()
	// The VMMs' CPU is counted once they are reaped, so it includes their
	// idle life until the end of the measurement and their shutdown.
	_, child1 := cpuNow()
	res.selfCPU, res.childCPU = (self1-self0)/time.Duration(n), (child1-child0)/time.Duration(n)
	return res, err
}

func fsName(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "an unknown filesystem"
	}
	switch st.Type {
	case unix.XFS_SUPER_MAGIC:
		return "XFS"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("filesystem 0x%x", st.Type)
}
