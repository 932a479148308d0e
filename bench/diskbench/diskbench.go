// Package diskbench holds two benchmark sections about snapshot disks on
// XFS with reflink, each on a loop-mounted image it makes (root, mkfs.xfs):
//
//   - genbench (Run): 10 hibernate/wake generations of one VM's disk, as
//     the Cloud Hypervisor recipes clone it (hibernate: FICLONE of the run
//     dir's cow.raw into the snapshot; wake: FICLONE of the snapshot's back
//     into a run dir), with a guest's scattered writes between them: the
//     source's extent count (FIEMAP) and the FICLONE time per generation,
//     without and with the dense-rewrite rule (fsx.RewriteDense past
//     fsx.DefaultExtentBound, run after each hibernate as the driver's
//     AfterCommit does). The comparator is the seeds' measurement on the
//     replaced system (about 18 µs per extent; +47 to +601 extents per
//     generation after the third), quoted, not re-measured.
//   - archivebench (RunArchive): archive (archive.DirStore.Put: copy, fsync
//     per file, manifest, read-back verify with the cache dropped, rename;
//     where its time goes, per step, from the DirStore's hook)
//     and unarchive (Get, SyncTree) throughput of a snapshot's bytes,
//     against a plain copy (io.Copy and fsync per file) of the same bytes
//     between the same two filesystems, in the same run.
package diskbench

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/fsx"
)

// Seeds' figures (the replaced system, production host), the comparator.
const (
	seedsUSPerExtent = 18.0
	seedsGrowth      = "+47 to +601 extents per generation after the third"
)

// genConfig shapes the generations.
type genConfig struct {
	diskMiB     int // the template disk, written densely
	generations int
	randWrites  int // scattered 4 KiB guest writes per generation
	runWrites   int // 64 KiB guest writes per generation
}

var (
	genFull  = genConfig{diskMiB: 512, generations: 10, randWrites: 400, runWrites: 40}
	genQuick = genConfig{diskMiB: 64, generations: 10, randWrites: 200, runWrites: 20}
)

// mountXFS makes a sizeBytes XFS image with reflink=1 under dir and
// loop-mounts it; the returned func unmounts it and removes the image.
func mountXFS(ctx context.Context, dir string, size int64) (string, func(), error) {
	for _, tool := range []string{"mkfs.xfs", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", nil, fmt.Errorf("diskbench needs %s (xfsprogs, util-linux) and root: %w", tool, err)
		}
	}
	img, mnt := filepath.Join(dir, "xfs.img"), filepath.Join(dir, "xfs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return "", nil, err
	}
	if err := os.Truncate(img, size); err != nil {
		return "", nil, err
	}
	for _, argv := range [][]string{{"mkfs.xfs", "-q", "-m", "reflink=1", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("diskbench: %s: %v: %s", argv[0], err, strings.TrimSpace(string(out)))
		}
	}
	return mnt, func() {
		if exec.Command("umount", mnt).Run() != nil {
			_ = exec.Command("umount", "-l", mnt).Run()
		}
		_ = os.Remove(img)
	}, nil
}

// writeRandom writes n MiB of random bytes to path, densely, and fsyncs.
func writeRandom(path string, mib int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for range mib {
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		if _, err := f.Write(buf); err != nil {
			return err
		}
	}
	return f.Sync()
}

// guestWrites scatters a generation's writes over disk and fsyncs them (a
// hibernate's FICLONE flushes dirty pages first; the flush is kept out of
// the clone's time).
func guestWrites(disk string, cfg genConfig, r *mrand.Rand) error {
	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	pages := int64(cfg.diskMiB) << 20 / 4096
	page, run := make([]byte, 4096), make([]byte, 64<<10)
	for range cfg.randWrites {
		page[0]++
		if _, err := f.WriteAt(page, r.Int64N(pages)*4096); err != nil {
			return err
		}
	}
	for range cfg.runWrites {
		run[0]++
		if _, err := f.WriteAt(run, r.Int64N(pages-16)*4096); err != nil {
			return err
		}
	}
	return f.Sync()
}

// generation is one hibernate/wake of the chain.
type generation struct {
	extents     int           // the hibernate source's extents
	hibernate   time.Duration // its FICLONE
	wakeExtents int           // the wake source's (the snapshot's, after any rewrite)
	wake        time.Duration // the wake's FICLONE
	rewrite     time.Duration // the background dense rewrite (0: none)
}

// chain runs cfg.generations hibernate/wake generations under dir, with the
// rewrite rule at bound (negative: off).
func chain(dir string, cfg genConfig, bound int, seed uint64) ([]generation, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cl := fsx.NewCloner(zerolog.Nop())
	base := filepath.Join(dir, "template.raw")
	if err := writeRandom(base, cfg.diskMiB); err != nil {
		return nil, err
	}
	run := filepath.Join(dir, "run-0.raw")
	if _, err := cl.Clone(run, base); err != nil {
		return nil, err
	}
	r := mrand.New(mrand.NewPCG(seed, 7))
	var out []generation
	for g := 1; g <= cfg.generations; g++ {
		var gen generation
		if err := guestWrites(run, cfg, r); err != nil {
			return nil, err
		}
		ext, err := fsx.Extents(run)
		if err != nil {
			return nil, err
		}
		gen.extents = len(ext)
		snap := filepath.Join(dir, fmt.Sprintf("snap-%d.raw", g))
		t0 := time.Now()
		if _, err := cl.Clone(snap, run); err != nil {
			return nil, err
		}
		gen.hibernate = time.Since(t0)
		if err := os.Remove(run); err != nil { // the hibernate removes the run dir
			return nil, err
		}
		if bound >= 0 {
			t0 = time.Now()
			res, err := fsx.RewriteDense(snap, bound)
			if err != nil {
				return nil, err
			}
			if res.Rewritten {
				gen.rewrite = time.Since(t0)
			}
		}
		if ext, err = fsx.Extents(snap); err != nil {
			return nil, err
		}
		gen.wakeExtents = len(ext)
		run = filepath.Join(dir, fmt.Sprintf("run-%d.raw", g))
		t0 = time.Now()
		if _, err := cl.Clone(run, snap); err != nil {
			return nil, err
		}
		gen.wake = time.Since(t0)
		if err := os.Remove(snap); err != nil { // the wake's AfterCommit drops the snapshot
			return nil, err
		}
		out = append(out, gen)
	}
	return out, nil
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }

// Run is the genbench section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := genFull
	if opts.Quick {
		cfg = genQuick
	}
	loadStart := report.LoadAvg()
	dir, done, err := opts.Dir("genbench")
	if err != nil {
		return nil, err
	}
	defer done()
	mnt, unmount, err := mountXFS(ctx, dir, int64(cfg.diskMiB)*8<<20+(1<<30))
	if err != nil {
		return nil, err
	}
	defer unmount()
	plain, err := chain(filepath.Join(mnt, "plain"), cfg, -1, 1)
	if err != nil {
		return nil, err
	}
	ruled, err := chain(filepath.Join(mnt, "rule"), cfg, fsx.DefaultExtentBound, 1)
	if err != nil {
		return nil, err
	}
	sec := &report.Section{
		Name:  "genbench",
		Title: "Disk generations on XFS (reflink): extents and FICLONE time per hibernate/wake generation, without and with the dense-rewrite rule",
		Method: fmt.Sprintf("A %d MiB template disk written densely with random bytes on a loop-mounted XFS image (mkfs.xfs -m reflink=1), "+
			"FICLONEd into a run disk; then %d generations of: the guest's writes (%d scattered 4 KiB writes and %d of 64 KiB at random "+
			"offsets, fsynced), hibernate (FICLONE of the run disk into the snapshot, timed; the run disk removed), wake (FICLONE of the "+
			"snapshot into a new run disk, timed; the snapshot removed), as the Cloud Hypervisor recipes clone cow.raw. Extents are "+
			"FIEMAP's count of the clone's source. With the rule, fsx.RewriteDense(snapshot, %d) runs after each hibernate (the driver runs "+
			"it in the background, as the hibernate's AfterCommit); its time is shown but is off the hibernate's and the wake's path. "+
			"The same seeded writes in both chains.", cfg.diskMiB, cfg.generations, cfg.randWrites, cfg.runWrites, fsx.DefaultExtentBound),
		Header: []string{"generation", "extents (no rule)", "hibernate FICLONE µs (no rule)", "wake FICLONE µs (no rule)",
			"extents (rule)", "hibernate FICLONE µs (rule)", "wake FICLONE µs (rule)", "rewrite ms (rule, background)"},
	}
	for i := range plain {
		p, q := plain[i], ruled[i]
		rw := "-"
		if q.rewrite > 0 {
			rw = fmt.Sprintf("%.1f", float64(q.rewrite)/float64(time.Millisecond))
		}
		sec.AddRow(i+1, p.extents, us(p.hibernate), us(p.wake), fmt.Sprintf("%d (wake src %d)", q.extents, q.wakeExtents), us(q.hibernate), us(q.wake), rw)
	}
	last, first := plain[len(plain)-1], plain[0]
	perExtent := float64(last.hibernate-first.hibernate) / float64(time.Microsecond) / float64(max(1, last.extents-first.extents))
	growth := float64(last.extents-first.extents) / float64(max(1, len(plain)-1))
	sec.AddRow("seeds (replaced system, quoted)", "", fmt.Sprintf("~%.0f µs per extent", seedsUSPerExtent), "", seedsGrowth, "", "", "")
	maxRuled, step := 0, first.extents
	for i, g := range ruled {
		maxRuled = max(maxRuled, g.extents)
		if i > 0 {
			step = max(step, plain[i].extents-plain[i-1].extents)
		}
	}
	sec.Verdict(maxRuled <= fsx.DefaultExtentBound+step,
		"with the rule a hibernate's source stays within the bound (%d) plus one generation's growth (%d): max %d extents; without the rule %d at generation %d",
		fsx.DefaultExtentBound, step, maxRuled, last.extents, len(plain))
	sec.Notes = append(sec.Notes,
		fmt.Sprintf("Without the rule: +%.0f extents per generation here, FICLONE %.2f µs per added extent (generation 1 to %d), against the seeds' ~%.0f µs per extent.",
			growth, perExtent, len(plain), seedsUSPerExtent),
		fmt.Sprintf("Machine: %d CPUs; load average %s at the start, %s at the end; the XFS image is a sparse file on the scratch dir's disk.",
			runtime.NumCPU(), loadStart, report.LoadAvg()))
	return sec, nil
}
