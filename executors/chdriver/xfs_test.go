package chdriver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
	"github.com/sbxlog/sbxlog/fsm"
)

// TestXFSReflink is acceptance 1 on a real XFS with reflink: a clone's
// cow.raw shares all its extents with the golden's, and a hibernate
// snapshot's cow.raw shares its extents with the VM's. Needs root (loop
// mount); CI sets SBX_REQUIRE_XFS=1 so it cannot be skipped there.
func TestXFSReflink(t *testing.T) {
	mnt := xfstest.Mount(t, 1<<30)
	h := newHarness(t, filepath.Join(mnt, "d"))
	rep, err := h.d.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.CopyMode != fsx.Reflink {
		t.Fatalf("Prepare detected %s on XFS, want reflink", rep.CopyMode)
	}
	golden := h.buildGolden(testKey)
	gdisk := filepath.Join(h.store(golden), DiskFile)
	if ok, err := fsx.AllExtentsShared(gdisk); err != nil || !ok {
		t.Fatalf("golden cow.raw is not a reflink of the template disk: %v %v", ok, err)
	}

	const vm = "vm-00000000000000c1"
	res := h.clone(vm, golden)
	if res.Report.CopyMode != "reflink" {
		t.Fatalf("clone report says %q", res.Report.CopyMode)
	}
	disk := filepath.Join(h.runDir(vm), DiskFile)
	assertShares(t, disk, gdisk)

	// The hibernate snapshot's cow.raw, checked right after its FICLONE,
	// while the VM's own cow.raw still exists.
	var shared, total uint64
	var checkErr error
	h.tr.reset()
	h.setHook(func(_ context.Context, s StepCall) error {
		if s.Recipe == string(fsm.KindHibernate) && s.Step == StepSyncFiles && !s.Undo {
			tmp := tempOf(t, effects(h.tr.snapshot()))
			shared, total, checkErr = fsx.SharedBytes(filepath.Join(tmp, DiskFile), disk)
		}
		return nil
	})
	hres, err := h.d.Hibernate(context.Background(), fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm})
	if err != nil {
		t.Fatal(err)
	}
	if checkErr != nil || total == 0 || shared != total {
		t.Fatalf("snapshot cow.raw shares %d of %d bytes with the VM's (%v)", shared, total, checkErr)
	}
	if hres.Report.CopyMode != "reflink" {
		t.Fatalf("hibernate report says %q", hres.Report.CopyMode)
	}
	assertShares(t, filepath.Join(h.store(hres.SnapshotDir), DiskFile), gdisk)
}

func assertShares(t *testing.T, a, b string) {
	t.Helper()
	if ok, err := fsx.AllExtentsShared(a); err != nil || !ok {
		t.Fatalf("%s: not every extent is shared (%v)", a, err)
	}
	shared, total, err := fsx.SharedBytes(a, b)
	if err != nil || total == 0 || shared != total {
		t.Fatalf("%s shares %d of %d bytes with %s (%v)", a, shared, total, b, err)
	}
}

// TestNoReflinkFallback is acceptance 1's other half: on filesystems without
// reflink the sparse-copy fallback runs, the reports say "copy", the copies
// are sparse and hold the same bytes, and the fallback is logged once.
func TestNoReflinkFallback(t *testing.T) {
	for _, kind := range []xfstest.NoReflink{xfstest.Tmpfs, xfstest.Ext4} {
		t.Run(string(kind), func(t *testing.T) {
			mnt := xfstest.MountNoReflink(t, 512<<20, kind)
			h := newHarness(t, filepath.Join(mnt, "d"))
			golden := h.buildGolden(testKey)
			gdisk := filepath.Join(h.store(golden), DiskFile)
			const vm = "vm-00000000000000c2"
			res := h.clone(vm, golden)
			if res.Report.CopyMode != "copy" {
				t.Fatalf("clone report says %q, want copy", res.Report.CopyMode)
			}
			disk := filepath.Join(h.runDir(vm), DiskFile)
			assertSparseCopy(t, disk, gdisk)
			hres, err := h.d.Hibernate(context.Background(), fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm})
			if err != nil {
				t.Fatal(err)
			}
			if hres.Report.CopyMode != "copy" {
				t.Fatalf("hibernate report says %q, want copy", hres.Report.CopyMode)
			}
			assertSparseCopy(t, filepath.Join(h.store(hres.SnapshotDir), DiskFile), gdisk)
			// Once for the store's filesystem (Prepare primes the cache the
			// recipes share), once more at most for the template's disk,
			// which lives on the same filesystem here.
			if n := strings.Count(h.logs.String(), "clones here are sparse copies"); n != 1 {
				t.Fatalf("copy fallback logged %d times, want once:\n%s", n, h.logs.String())
			}
		})
	}
}

func assertSparseCopy(t *testing.T, copyPath, src string) {
	t.Helper()
	if sparse, err := fsx.IsSparse(copyPath); err != nil || !sparse {
		t.Fatalf("%s is not sparse (%v)", copyPath, err)
	}
	alloc, err := fsx.AllocatedBytes(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if limit := 2 * testSynth.DataBytes; alloc > limit {
		t.Fatalf("%s allocates %d bytes for %d bytes of data", copyPath, alloc, testSynth.DataBytes)
	}
	if sha(t, copyPath) != sha(t, src) {
		t.Fatalf("%s differs from %s", copyPath, src)
	}
}

// TestCapacityENOSPC: a full store filesystem fails a clone with an error
// the scheduler classifies as capacity (it parks refills), and the failed
// clone leaves nothing behind.
func TestCapacityENOSPC(t *testing.T) {
	mnt := xfstest.MountNoReflink(t, 8<<20, xfstest.Tmpfs)
	h := newHarness(t, filepath.Join(mnt, "d"))
	golden := h.seed(sharedGolden(t))
	fill, err := os.Create(filepath.Join(mnt, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := fill.Write(buf); err != nil {
			break
		}
	}
	fill.Close()
	const vm = "vm-00000000000000c3"
	_, err = h.d.Clone(context.Background(), cloneIntent(vm, golden, testKey))
	if !executors.IsCapacity(err) || !errors.Is(err, executors.ErrCapacity) {
		t.Fatalf("clone on a full filesystem: %v, want a capacity error", err)
	}
	h.checkGone(h.runDir(vm))
}
