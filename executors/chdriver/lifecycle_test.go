package chdriver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/probe"
	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/fsm"
)

// TestLifecycle runs every recipe once, in the order a VM lives: golden,
// clone, hibernate, wake (and its post-commit drop), destroy.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	ctx := context.Background()

	golden := h.buildGolden(testKey)
	gdir := h.store(golden)
	m, err := ReadMeta(gdir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Kind != fsm.KindGolden || m.Key != testKey {
		t.Fatalf("golden meta %+v", m)
	}
	if got := h.storeEntries(layout.GoldenStore); len(got) != 1 {
		t.Fatalf("store/golden: %v", got)
	}
	if _, err := os.Stat(h.d.roots.GoldenRunDir(h.d.instance, event0(m))); !os.IsNotExist(err) {
		t.Fatalf("golden build run dir left behind: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Roots.Templates, testKey.Template, "config.json")); err != nil {
		t.Fatalf("chsim template not synthesized: %v", err)
	}

	const vm = "vm-00000000000000a1"
	res := h.clone(vm, golden)
	want := []string{StepAdopt, StepCheck, StepResetRun, StepLinkMemory, StepCloneDisk, StepWriteState, StepWriteConfig, StepLaunch, StepRestore, StepResume, StepProbe}
	if got := stepNames(res.Report); !slices.Equal(got, want) {
		t.Fatalf("clone steps %v, want %v", got, want)
	}
	if res.Report.CopyMode == "" {
		t.Fatal("clone report has no copy mode")
	}
	run := h.runDir(vm)
	// memory-ranges is the golden's inode, not a copy.
	a, _ := os.Stat(filepath.Join(run, RestoreDir, MemoryFile))
	b, _ := os.Stat(filepath.Join(gdir, MemoryFile))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Fatal("run dir memory-ranges is not a hard link to the golden's")
	}
	cfg, err := os.ReadFile(filepath.Join(run, RestoreDir, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ch.ParseConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.DiskPaths()[0] != filepath.Join(run, DiskFile) || c.VsockSocket() != filepath.Join(run, VsockFile) {
		t.Fatalf("config paths not rewritten: disk %v vsock %s", c.DiskPaths(), c.VsockSocket())
	}
	if _, ok := c.Get("rng", "src"); !ok {
		t.Fatal("rewrite dropped an unknown key (rng)")
	}
	if h.vmState(vm) != ch.StateRunning {
		t.Fatalf("clone not running: %q", h.vmState(vm))
	}
	if pid, ok := vmmPid(run); !ok {
		t.Fatal("clone has no live VMM pid")
	} else if got, err := h.d.VMMPid(vm, testInstance+"/"+vm); err != nil || got != pid {
		t.Fatalf("VMMPid = %d, %v; want %d", got, err, pid)
	}
	if err := probe.Connect(ctx, filepath.Join(run, VsockFile), 1024); err != nil {
		t.Fatalf("guest agent not answering after clone: %v", err)
	}

	hib := fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: testInstance + "/" + vm}
	hres, err := h.d.Hibernate(ctx, hib)
	if err != nil {
		t.Fatal(err)
	}
	snap := h.store(hres.SnapshotDir)
	if _, err := ReadMeta(snap); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Fatalf("hibernate left the run dir: %v", err)
	}
	if _, err := h.d.VMMPid(vm, hib.RunDir); !errors.Is(err, vmm.ErrNoProcess) {
		t.Fatalf("VMMPid of a hibernated VM = %v, want vmm.ErrNoProcess", err)
	}
	beats := snapshotHeartbeats(t, snap)

	wk := fsm.WakeVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir}
	wres, err := h.d.Wake(ctx, wk)
	if err != nil {
		t.Fatal(err)
	}
	if h.vmState(vm) != ch.StateRunning {
		t.Fatal("woken VM not running")
	}
	if got := h.heartbeats(vm); got < beats {
		t.Fatalf("woken guest has %d heartbeats, the snapshot had %d: memory not restored", got, beats)
	}
	if _, err := os.Stat(snap); err != nil {
		t.Fatal("wake removed the snapshot before its result was committed")
	}
	if wres.AfterCommit == nil {
		t.Fatal("wake has no post-commit drop")
	}
	if err := wres.AfterCommit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(snap); !os.IsNotExist(err) {
		t.Fatalf("snapshot not dropped: %v", err)
	}
	// The VM keeps running on its own link to memory-ranges.
	b0 := h.heartbeats(vm)
	waitFor(t, 5e9, "heartbeats after the snapshot drop", func() bool { return h.heartbeats(vm) > b0 })

	dres, err := h.d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir})
	if err != nil {
		t.Fatal(err)
	}
	if len(dres.Report.Steps) == 0 {
		t.Fatal("destroy report empty")
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Fatalf("destroy left the run dir: %v", err)
	}
	if h.vmState(vm) != "" {
		t.Fatal("VMM still answers after destroy")
	}
	// A second destroy is a no-op success.
	if _, err := h.d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: hib.RunDir, SnapshotDir: hres.SnapshotDir}); err != nil {
		t.Fatalf("repeated destroy: %v", err)
	}
	if tmp := h.storeTemps(); len(tmp) != 0 {
		t.Fatalf("temp dirs left in the store: %v", tmp)
	}
}

func event0(m *Meta) event.OpID {
	id, err := ulid.ParseStrict(m.Op)
	if err != nil {
		panic(err)
	}
	return id
}

// TestBadIntents: paths outside the roots, another instance's VM, a missing
// golden are unrecoverable and touch nothing.
func TestBadIntents(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	ctx := context.Background()
	outside := filepath.Join(h.data, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		call func() error
	}{
		{"clone run dir climbs out", func() error {
			_, err := h.d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: "vm-1", Key: testKey, RunDir: testInstance + "/../../outside", GoldenDir: "golden/x"})
			return err
		}},
		{"clone of another instance", func() error {
			_, err := h.d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: "vm-1", Key: testKey, RunDir: "other/vm-1", GoldenDir: "golden/x"})
			return err
		}},
		{"clone without golden", func() error {
			_, err := h.d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: "vm-1", Key: testKey, RunDir: testInstance + "/vm-1"})
			return err
		}},
		{"clone of a missing golden", func() error {
			_, err := h.d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: "vm-1", Key: testKey, RunDir: testInstance + "/vm-1", GoldenDir: "golden/nope"})
			return err
		}},
		{"destroy of another instance", func() error {
			_, err := h.d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: "vm-1", Key: testKey, Instance: "other", RunDir: "other/vm-1"})
			return err
		}},
		{"destroy removing a golden", func() error {
			_, err := h.d.Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: "vm-1", Key: testKey, Instance: testInstance, RunDir: testInstance + "/vm-1", SnapshotDir: "golden/x"})
			return err
		}},
		{"wake from an absolute path", func() error {
			_, err := h.d.Wake(ctx, fsm.WakeVM{OpID: newOp(), VM: "vm-1", Key: testKey, RunDir: testInstance + "/vm-1", SnapshotDir: outside})
			return err
		}},
		{"golden of an unknown size", func() error {
			_, err := h.d.BuildGolden(ctx, fsm.BuildGolden{OpID: newOp(), Key: fsm.PoolKey{Template: "default", Net: "none", Size: "huge"}})
			return err
		}},
		{"golden of a template climbing out", func() error {
			_, err := h.d.BuildGolden(ctx, fsm.BuildGolden{OpID: newOp(), Key: fsm.PoolKey{Template: "a/../../x", Net: "none", Size: "small"}})
			return err
		}},
		{"egress without a bridge", func() error {
			_, err := h.d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: "vm-1", Key: fsm.PoolKey{Template: "default", Net: "egress", Size: "small"}, RunDir: testInstance + "/vm-1", GoldenDir: "golden/x"})
			return err
		}},
	}
	for _, c := range cases {
		err := c.call()
		if !executors.IsUnrecoverable(err) {
			t.Errorf("%s: got %v, want an unrecoverable error", c.name, err)
		}
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("a bad intent touched a dir outside the roots: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(h.cfg.Roots.Runs, testInstance)); len(ents) != 0 {
		t.Fatalf("bad intents left run dirs: %v", ents)
	}
}

// TestMissingTemplateRealCH: with cloud-hypervisor a missing template is an
// unrecoverable error naming the path, and nothing is synthesized.
func TestMissingTemplateRealCH(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "", func(c *Config) { c.Hypervisor = CloudHypervisor })
	_, err := h.d.BuildGolden(context.Background(), fsm.BuildGolden{OpID: newOp(), Key: testKey})
	if !executors.IsUnrecoverable(err) {
		t.Fatalf("got %v, want unrecoverable", err)
	}
	want := filepath.Join(h.cfg.Roots.Templates, testKey.Template)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
	if _, err := os.Stat(want); !os.IsNotExist(err) {
		t.Fatal("a template was synthesized for cloud-hypervisor")
	}
}

// TestDestroyWedgedVMM: a VMM that answers neither vm.shutdown nor
// vmm.shutdown and ignores SIGTERM is killed, each step bounded by the
// grace period, and the destroy completes.
func TestDestroyWedgedVMM(t *testing.T) {
	t.Parallel()
	const grace = 200 * time.Millisecond
	h := newHarness(t, "", func(c *Config) {
		c.StopGrace = grace
		c.VMMEnv = append(c.VMMEnv, "SBX_CHSIM_FAIL=vm.shutdown:1+:hang,vmm.shutdown:1+:hang", "SBX_CHSIM_IGNORE_SIGTERM=1")
	})
	const vm = "vm-00000000000000a9"
	h.clone(vm, h.seed(sharedGolden(t)))
	start := time.Now()
	_, err := h.d.Destroy(context.Background(), fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: testInstance + "/" + vm})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*grace {
		t.Fatalf("destroy of a wedged VMM took %v", took)
	}
	if n := len(h.liveVMMs()); n != 0 {
		t.Fatalf("%d VMMs alive after destroy", n)
	}
	if !strings.Contains(h.logs.String(), "VMM needed SIGKILL") {
		t.Fatal("the SIGKILL was not logged")
	}
	h.checkGone(h.runDir(vm))
}
