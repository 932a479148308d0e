// Package qemubench is the QEMU driver's benchmark section (`go run ./bench -only
// qemubench`): hibernate and wake of the project's 256 MiB test guest (TCG),
// split into their QMP, clone (FICLONE or copy) and fsync parts, on a loop-mounted
// XFS with reflink and, side by side in the same run, on a loop-mounted ext4 where
// every clone is a copy. The Cloud Hypervisor figures from the seeds (8 GiB guest,
// production hosts) are printed next to them for reference; they were not measured
// here.
//
// One golden (built on XFS, copied to ext4) and per filesystem one clone: a guest that holds resident data (a
// large file in its tmpfs, written once) and dirties 8 MiB before every hibernate;
// each hibernate/wake cycle checks that the guest's sha256 of those 8 MiB survived.
// Needs root (loop mounts), qemu-system-x86, busybox-static, cpio, xfsprogs and
// e2fsprogs.
package qemubench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/qemu"
)

// config sizes one run.
type config struct {
	cycles    int   // hibernate/wake cycles per filesystem
	resident  int64 // bytes the guest writes once into its tmpfs (RAM it keeps using)
	dirty     int64 // bytes the guest rewrites before each hibernate
	memoryMiB int
}

func configFor(quick bool) config {
	if quick {
		return config{cycles: 2, resident: 16 << 20, dirty: 8 << 20, memoryMiB: 256}
	}
	return config{cycles: 10, resident: 96 << 20, dirty: 8 << 20, memoryMiB: 256}
}

// The Cloud Hypervisor anchors measured on the replaced system (8 GiB guest,
// XFS with reflink): hibernate ~0.3 s, wake 0.4–0.7 s.
const (
	seedXFSHibernate = 300 * time.Millisecond
	seedXFSWakeLo    = 400 * time.Millisecond
	seedXFSWakeHi    = 700 * time.Millisecond
)

// fsRun is the measurements on one filesystem.
type fsRun struct {
	label     string // "XFS (reflink)"
	method    fsx.Method
	hibernate []qemu.RecipeResult
	wake      []qemu.RecipeResult
	ramAlloc  int64 // allocated bytes of the guest's RAM file at the last hibernate
	stateSize int64
}

// Run measures the section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := configFor(opts.Quick)
	if os.Geteuid() != 0 {
		return nil, errors.New("qemubench: needs root to loop-mount XFS and ext4")
	}
	for _, tool := range []string{"mkfs.xfs", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("qemubench: %s not found (apt-get install xfsprogs e2fsprogs)", tool)
		}
	}
	g, err := guesttest.Build(ctx)
	if err != nil {
		return nil, fmt.Errorf("qemubench: guest: %w", err)
	}

	d, err := qemu.NewRecipes(qemu.RecipesConfig{Accel: qemu.AccelTCG})
	if err != nil {
		return nil, err
	}
	// One golden (one cold boot) serves both filesystems: it is built on XFS and
	// its files are copied into the ext4 store.
	var runs []*fsRun
	var golden string
	for _, fsys := range []struct{ label, mkfs string }{
		{"XFS (reflink)", "xfs"},
		{"ext4 (copy)", "ext4"},
	} {
		mnt, unmount, err := MountLoop(ctx, opts.Scratch, fsys.mkfs, 4<<30)
		if err != nil {
			return nil, fmt.Errorf("qemubench: %s: %w", fsys.label, err)
		}
		defer func() { _ = unmount() }()
		r, err := measureOn(ctx, cfg, d, g, mnt, fsys.label, &golden)
		if err != nil {
			return nil, fmt.Errorf("qemubench: %s: %w", fsys.label, err)
		}
		runs = append(runs, r)
	}
	return section(cfg, runs), nil
}

// measureOn runs the cycles on the filesystem mounted at mnt. *golden is the
// golden snapshot directory: built here when empty, else copied into this store.
func measureOn(ctx context.Context, cfg config, d *qemu.Recipes, g guesttest.Guest, mnt, label string, golden *string) (r *fsRun, err error) {
	vm, destroy, err := StartVM(ctx, d, g, mnt, cfg.memoryMiB, cfg.resident, golden)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := destroy(); derr != nil && err == nil {
			err = derr
		}
	}()

	r = &fsRun{label: label}
	for i := range cfg.cycles {
		// The resident data moves to the RAM file's pages the guest freed when the
		// data file is replaced; dirty fresh pages before every hibernate.
		sum, err := GuestDo(ctx, vm, func(a *agent.Client) (string, error) { return a.Write(ctx, cfg.dirty) })
		if err != nil {
			return nil, fmt.Errorf("cycle %d: write: %w", i, err)
		}
		if i == cfg.cycles-1 {
			r.ramAlloc, _ = fsx.AllocatedBytes(filepath.Join(vm.RunDir, qemu.FileRAM))
		}
		name := fmt.Sprintf("hib-%d", i)
		hr, err := d.Hibernate(ctx, vm, name)
		if err != nil {
			return nil, fmt.Errorf("cycle %d: hibernate: %w", i, err)
		}
		wr, err := d.Wake(ctx, vm, name)
		if err != nil {
			return nil, fmt.Errorf("cycle %d: wake: %w", i, err)
		}
		got, err := GuestDo(ctx, vm, func(a *agent.Client) (string, error) { return a.Sha(ctx) })
		if err != nil || got != sum {
			return nil, fmt.Errorf("cycle %d: guest data after wake: sha %q (%v), want %q", i, got, err, sum)
		}
		if err := os.RemoveAll(vm.SnapshotDir(name)); err != nil {
			return nil, err
		}
		r.hibernate = append(r.hibernate, hr)
		r.wake = append(r.wake, wr)
		r.method, r.stateSize = hr.Method, hr.StateBytes
	}
	return r, nil
}

// StartVM makes a store and a run root on the filesystem mounted at mnt,
// a golden of the guest g there (booted when *golden is empty, which it
// then names; else copied from *golden), and a VM cloned from it that has
// written resident bytes into its tmpfs (RAM it keeps using). destroy
// ends the VM.
func StartVM(ctx context.Context, d *qemu.Recipes, g guesttest.Guest, mnt string, memoryMiB int, resident int64, golden *string) (vm qemu.Spec, destroy func() error, err error) {
	store, runRoot := filepath.Join(mnt, "store"), filepath.Join(mnt, "run")
	for _, dir := range []string{store, runRoot} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return vm, nil, err
		}
	}
	spec := func(name string) qemu.Spec {
		return qemu.Spec{RunDir: filepath.Join(runRoot, name), StoreDir: store,
			MemoryMiB: memoryMiB, Kernel: g.Kernel, Initrd: g.Initrd}
	}
	if *golden == "" {
		if _, err := d.Golden(ctx, spec("golden-build"), "golden"); err != nil {
			return vm, nil, err
		}
		*golden = spec("").SnapshotDir("golden")
	} else if err := copyDir(spec("").SnapshotDir("golden"), *golden); err != nil {
		return vm, nil, err
	}
	vm = spec("vm")
	destroy = func() error {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := d.Destroy(dctx, vm)
		return err
	}
	if _, err := d.Clone(ctx, vm, "golden"); err != nil {
		return vm, nil, errors.Join(err, destroy())
	}
	if _, err := GuestDo(ctx, vm, func(a *agent.Client) (string, error) { return a.Write(ctx, resident) }); err != nil {
		return vm, nil, errors.Join(fmt.Errorf("resident write: %w", err), destroy())
	}
	return vm, destroy, nil
}

// GuestDo runs f on a fresh connection to spec's guest agent, bounded by two minutes.
func GuestDo(ctx context.Context, spec qemu.Spec, f func(*agent.Client) (string, error)) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	a, err := agent.Dial(ctx, qemu.AgentSocket(spec.RunDir))
	if err != nil {
		return "", err
	}
	defer a.Close()
	return f(a)
}

// parts splits a recipe's steps into the columns of the table.
type parts struct {
	total, qmp, clone, fsync, proc, rest report.Durations
}

// stepSplit names the steps of each column; clone is always qemu.StepClone and
// rest is whatever the other columns leave.
type stepSplit struct {
	qmp, fsync, proc []string
}

func sum(r qemu.RecipeResult, steps []string) time.Duration {
	var d time.Duration
	for _, n := range steps {
		d += r.Dur(n)
	}
	return d
}

func split(rs []qemu.RecipeResult, s stepSplit) parts {
	var p parts
	for _, r := range rs {
		q, f, pr := sum(r, s.qmp), sum(r, s.fsync), sum(r, s.proc)
		c := r.Dur(qemu.StepClone)
		t := r.Total()
		p.total = append(p.total, t)
		p.qmp = append(p.qmp, q)
		p.clone = append(p.clone, c)
		p.fsync = append(p.fsync, f)
		p.proc = append(p.proc, pr)
		p.rest = append(p.rest, t-q-c-f-pr)
	}
	return p
}

var (
	// Hibernate: QMP is stop + migrate (device state to the state file); fsync is
	// meta.json's atomic write, SyncTree (on XFS the first fsync also forces the
	// log holding the reflink) and the rename, whose cost is fsyncing both
	// parents; the QEMU process column is quit until the process is gone; rest
	// is removing the run dir.
	hibSplit = stepSplit{
		qmp:   []string{qemu.StepStop, qemu.StepMigrate},
		fsync: []string{qemu.StepMeta, qemu.StepSync, qemu.StepRename},
		proc:  []string{qemu.StepQuit},
	}
	// Wake: QMP is migrate-incoming and cont; the QEMU process column is
	// starting QEMU up to its QMP greeting; rest is preparing the run dir and
	// the guest agent's first answer.
	wakeSplit = stepSplit{
		qmp:  []string{qemu.StepIncoming, qemu.StepCont},
		proc: []string{qemu.StepLaunch},
	}
)

func section(cfg config, runs []*fsRun) *report.Section {
	sec := &report.Section{
		Title: "QEMU driver: hibernate and wake of a 256 MiB guest, XFS reflink vs copy",
		Method: fmt.Sprintf(`executors/qemu on a %d MiB TCG guest (the project's Debian cloud kernel +
busybox initramfs), RAM in a share=on memory-backend-file in the run dir. Per filesystem (a 4 GiB
loop-mounted image: XFS with reflink=1, ext4 without): one clone of a golden, %d MiB written once
into the guest's tmpfs, then %d cycles of: guest rewrites %d MiB, hibernate, wake, sha256 check.
Hibernate = stop + migrate (x-ignore-shared, state to a file) [QMP], FICLONE or sparse copy of the
RAM file into the store [clone], meta.json + SyncTree + rename with its parent fsyncs [fsync],
quit until the process is gone [QEMU process], run dir removal [rest]. Wake = clone back [clone],
QEMU start until QMP answers [QEMU process], migrate-incoming + cont [QMP], run dir + the guest
agent's first answer [rest]. Cells are p50 / p99 over the cycles. CH rows: the seeds' production
traces of an 8 GiB guest, for reference only (not measured here): the reflink snapshot writes only
changed pages next to a FICLONE of the restore source; the dense one writes all 8 GiB, whose fsync is
the cost a copy path pays.`,
			cfg.memoryMiB, cfg.resident>>20, cfg.cycles, cfg.dirty>>20),
		Header: []string{"filesystem (path)", "recipe", "total", "QMP", "clone", "fsync", "QEMU process", "rest", "RAM file allocated", "state"},
	}
	cell := func(d report.Durations) string {
		return report.Fmt(d.Quantile(0.5)) + " / " + report.Fmt(d.Quantile(0.99))
	}
	byLabel := map[string]*fsRun{}
	for _, r := range runs {
		byLabel[r.label] = r
		h := split(r.hibernate, hibSplit)
		w := split(r.wake, wakeSplit)
		label := fmt.Sprintf("%s, cloned by %s", r.label, r.method)
		alloc := fmt.Sprintf("%d MiB", r.ramAlloc>>20)
		state := fmt.Sprintf("%d KiB", r.stateSize>>10)
		sec.AddRow(label, "hibernate", cell(h.total), cell(h.qmp), cell(h.clone), cell(h.fsync), cell(h.proc), cell(h.rest), alloc, state)
		sec.AddRow(label, "wake", cell(w.total), cell(w.qmp), cell(w.clone), "-", cell(w.proc), cell(w.rest), alloc, state)
	}
	// The replaced system's production traces (the seeds), split into the same
	// columns where they give the parts: QMP is CH's API (vm.info, vm.pause,
	// vm.snapshot), clone the FICLONE, fsync the memory file's (and, dense,
	// every) fsync, QEMU process the vm.shutdown.
	sec.AddRow("CH seeds, 8 GiB, XFS, reflink snapshot (f1dcd9900, gen 2)", "hibernate", "0.30 – 0.35 s (anchor: ~"+report.Fmt(seedXFSHibernate)+")",
		"0.22 – 0.27 s", "106 – 107 ms (memory-ranges)", "19 – 21 µs (memory-ranges)", "", "", "", "")
	sec.AddRow("CH seeds, 8 GiB, XFS, reflink snapshot (f1dcd9900, gen 2)", "wake",
		"0.41 – 0.77 s (anchor: "+report.Fmt(seedXFSWakeLo)+" – "+report.Fmt(seedXFSWakeHi)+")", "", "", "", "", "", "", "")
	sec.AddRow("CH seeds, 8 GiB, XFS, dense snapshot (traced run 2)", "hibernate", "22.73 s",
		"2.03 s", "~1 ms (cow.raw)", "20.56 s (15.23 s memory-ranges writeback)", "0.13 s", "", "8 GiB", "")

	xfs, ext4 := byLabel["XFS (reflink)"], byLabel["ext4 (copy)"]
	if xfs != nil && ext4 != nil {
		xh := split(xfs.hibernate, hibSplit).total.Quantile(0.5)
		xw := split(xfs.wake, wakeSplit).total.Quantile(0.5)
		eh := split(ext4.hibernate, hibSplit).total.Quantile(0.5)
		sec.Verdict(xfs.method == fsx.Reflink && ext4.method == fsx.Copy,
			"clone path detected per filesystem: XFS %s, ext4 %s (target reflink on XFS, copy on ext4)", xfs.method, ext4.method)
		sec.Verdict(xh <= seedXFSHibernate, "XFS hibernate p50 %s (target <= the seeds' CH %s; the guest is 32x smaller)",
			report.Fmt(xh), report.Fmt(seedXFSHibernate))
		sec.Verdict(xw <= seedXFSWakeHi, "XFS wake p50 %s to agent answer (target <= the seeds' CH %s)",
			report.Fmt(xw), report.Fmt(seedXFSWakeHi))
		sec.Verdict(eh > xh, "ext4 (copy) hibernate p50 %s is %.1fx XFS reflink %s (target: copy slower than reflink)",
			report.Fmt(eh), float64(eh)/float64(max(xh, 1)), report.Fmt(xh))
	}
	sec.Notes = append(sec.Notes,
		"TCG, not KVM: wake includes the emulated guest's agent answering; QMP/clone/fsync do not depend on the accelerator.",
		"The copy path copies only the RAM file's allocated ranges (SEEK_DATA), so its cost grows with the guest's resident memory, not its size.")
	return sec
}

// MountLoop (for this and the other QEMU sections) creates a sparse image of size bytes in dir, makes a filesystem of
// kind ("xfs" with reflink, or "ext4") and loop-mounts it. The returned function
// unmounts it (lazily if it stays busy) and removes the image.
func MountLoop(ctx context.Context, dir, kind string, size int64) (string, func() error, error) {
	base, err := os.MkdirTemp(dir, "qemubench-"+kind+"-")
	if err != nil {
		return "", nil, err
	}
	img, mnt := filepath.Join(base, "fs.img"), filepath.Join(base, "mnt")
	fail := func(err error) (string, func() error, error) {
		_ = os.RemoveAll(base)
		return "", nil, err
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return fail(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fail(err)
	}
	mkfs := []string{"mkfs.xfs", "-q", "-m", "reflink=1", img}
	if kind == "ext4" {
		mkfs = []string{"mkfs.ext4", "-q", "-F", img}
	}
	if out, err := exec.CommandContext(ctx, mkfs[0], mkfs[1:]...).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("%s: %v: %s", mkfs[0], err, strings.TrimSpace(string(out))))
	}
	if out, err := exec.CommandContext(ctx, "mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("mount -o loop: %v: %s", err, strings.TrimSpace(string(out))))
	}
	return mnt, func() error {
		var out []byte
		var err error
		for range 50 {
			if out, err = exec.Command("umount", mnt).CombinedOutput(); err == nil || !strings.Contains(string(out), "busy") {
				break
			}
			time.Sleep(100 * time.Millisecond) // a just-exited QEMU's files closing
		}
		if err != nil {
			if lout, lerr := exec.Command("umount", "-l", mnt).CombinedOutput(); lerr != nil {
				return fmt.Errorf("umount %s: %v: %s; lazy: %v: %s", mnt, err, out, lerr, lout)
			}
		}
		return os.RemoveAll(base)
	}, nil
}

// copyDir copies the regular files of src into a new directory dst.
func copyDir(dst, src string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	cl := fsx.NewCloner(zerolog.Nop())
	for _, e := range ents {
		if _, err := cl.Clone(filepath.Join(dst, e.Name()), filepath.Join(src, e.Name())); err != nil {
			return err
		}
	}
	return fsx.SyncTree(dst)
}
