package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

func stepNames(r executors.Result) []string {
	var out []string
	for _, s := range r.Report.Steps {
		out = append(out, s.Name)
	}
	return out
}

// Every intent kind against real TCG guests on XFS, with re-runs of each
// operation (same op id) and with fresh drivers standing in for daemon
// restarts, including restarts in the middle of a hibernate.
func TestIntentsWithQEMU(t *testing.T) {
	g := guesttest.Require(t)
	root := xfstest.Mount(t, 4<<30)
	killQEMUsOnCleanup(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	rec := fsx.NewRecorder(fsx.NewOS(zerolog.Nop()))
	// restart returns a new driver, Prepared, as a daemon start makes one.
	restart := func() *Driver {
		d := newDriver(t, root, func(c *Config) {
			c.Templates, c.FS, c.StopGrace = defaultTemplate(g.Kernel, g.Initrd), rec, 3*time.Second
		})
		if _, err := d.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		return d
	}
	store := filepath.Join(root, "store")
	d := restart()

	gop := newOp()
	gin := fsm.BuildGolden{OpID: gop, Key: testKey}
	gres, err := d.BuildGolden(ctx, gin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("golden: %+v", gres.Report)
	if gres.SnapshotDir != layout.GoldenRel(testKey, gop) || gres.Report.CopyMode != "reflink" || !slices.Contains(stepNames(gres), StepMigrate) {
		t.Fatalf("golden result %+v", gres)
	}
	if m, err := checkSnapshot(filepath.Join(store, gres.SnapshotDir)); err != nil || m.MemoryMiB != 256 || m.Accel != AccelTCG {
		t.Fatalf("golden snapshot: %+v, %v", m, err)
	}
	noEntry(t, d.roots.GoldenRunDir(d.instance, gop))
	if again, err := d.BuildGolden(ctx, gin); err != nil || again.SnapshotDir != gres.SnapshotDir || again.Report.CopyMode != "reflink" {
		t.Fatalf("re-run BuildGolden = %+v, %v", again, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(store, "golden")); len(ents) != 1 {
		t.Fatalf("golden dir holds %d entries after a re-run", len(ents))
	}

	vm := "vm-00000000000000c1"
	run := testInstance + "/" + vm
	runDir := filepath.Join(root, "run", run)
	spec := Spec{RunDir: runDir, StoreDir: store}
	cin := fsm.CloneVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: run, GoldenDir: gres.SnapshotDir}
	cres, err := d.Clone(ctx, cin)
	if err != nil {
		t.Fatal(err)
	}
	if cres.Report.CopyMode != "reflink" || !slices.Contains(stepNames(cres), StepIncoming) {
		t.Fatalf("clone result %+v", cres)
	}
	pid, err := d.Recipes().Adopt(spec)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := d.VMMPid(vm, run); err != nil || got != pid {
		t.Fatalf("VMMPid = %d, %v; want %d", got, err, pid)
	}
	if again, err := d.Clone(ctx, cin); err != nil || again.Report.CopyMode != "reflink" {
		t.Fatalf("re-run Clone = %+v, %v", again, err)
	}
	if p, err := d.Recipes().Adopt(spec); err != nil || p != pid {
		t.Fatalf("after re-run Clone: pid %d, %v; want %d", p, err, pid)
	}
	// A clone of the golden answers on the data plane with its own key (the
	// golden's guest was armed with the golden's).
	dataPlaneInfo(t, ctx, d, run)
	sum := guestDo(t, ctx, runDir, func(a *agent.Client) (string, error) { return a.Write(ctx, 8<<20) })
	before := guestDo(t, ctx, runDir, func(a *agent.Client) (agent.Uptime, error) { return a.Uptime(ctx) })
	hibStore := filepath.Join(store, "hibernate")

	// A daemon that died right after pausing the VM for a hibernate; after the
	// restart the re-run fails (injected) before its snapshot is in place: the
	// VM must run again, with its memory.
	qmpStop(t, ctx, runDir).Close()
	d = restart()
	failing := errors.New("injected clone failure")
	rec.Before = func(s fsx.Step) error {
		if s.Op == fsx.OpClone {
			return failing
		}
		return nil
	}
	hin := fsm.HibernateVM{OpID: newOp(), Claim: "sb_1", VM: vm, Key: testKey, RunDir: run}
	_, err = d.Hibernate(ctx, hin)
	rec.Before = nil
	if !errors.Is(err, failing) || executors.IsUnrecoverable(err) {
		t.Fatalf("failing hibernate = %v, want the retryable injected error", err)
	}
	if st, err := d.Recipes().Status(ctx, spec); err != nil || st != "running" {
		t.Fatalf("after the failed hibernate: %q, %v; want running", st, err)
	}
	noEntry(t, filepath.Join(store, layout.HibernateRel(vm, hin.OpID)))
	if tmp := tempDirs(t, hibStore); len(tmp) != 0 {
		t.Fatalf("temp dirs left: %v", tmp)
	}
	if got := guestDo(t, ctx, runDir, func(a *agent.Client) (string, error) { return a.Sha(ctx) }); got != sum {
		t.Fatalf("sha after the failed hibernate %s, want %s", got, sum)
	}

	// A daemon killed after the migration, before the rename: the restart
	// sweeps the temp dir and the re-run of the same intent snapshots afresh.
	crashAfterMigrate(t, ctx, runDir, hibStore)
	d = restart()
	if tmp := tempDirs(t, hibStore); len(tmp) != 0 {
		t.Fatalf("Prepare left temp dirs: %v", tmp)
	}
	hres, err := d.Hibernate(ctx, hin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hibernate after a crash: %+v", hres.Report)
	if hres.SnapshotDir != layout.HibernateRel(vm, hin.OpID) || hres.Report.CopyMode != "reflink" {
		t.Fatalf("hibernate result %+v", hres)
	}
	if _, err := checkSnapshot(filepath.Join(store, hres.SnapshotDir)); err != nil {
		t.Fatal(err)
	}
	waitNoQEMU(t, runDir, 5*time.Second)
	noEntry(t, runDir)
	if again, err := restart().Hibernate(ctx, hin); err != nil || again.SnapshotDir != hres.SnapshotDir || again.Report.CopyMode != "reflink" {
		t.Fatalf("re-run Hibernate = %+v, %v", again, err)
	}

	d = restart()
	win := fsm.WakeVM{OpID: newOp(), Claim: "sb_1", VM: vm, Key: testKey, RunDir: run, SnapshotDir: hres.SnapshotDir}
	wres, err := d.Wake(ctx, win)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wake: %+v", wres.Report)
	if wres.Report.CopyMode != "reflink" || wres.AfterCommit == nil {
		t.Fatalf("wake result %+v", wres)
	}
	pid, err = d.Recipes().Adopt(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restart().Wake(ctx, win); err != nil {
		t.Fatalf("re-run Wake: %v", err)
	}
	if p, err := d.Recipes().Adopt(spec); err != nil || p != pid {
		t.Fatalf("after re-run Wake: pid %d, %v; want %d", p, err, pid)
	}
	if got := guestDo(t, ctx, runDir, func(a *agent.Client) (string, error) { return a.Sha(ctx) }); got != sum {
		t.Fatalf("sha after wake %s, want %s", got, sum)
	}
	dataPlaneInfo(t, ctx, restart(), run)
	after := guestDo(t, ctx, runDir, func(a *agent.Client) (agent.Uptime, error) { return a.Uptime(ctx) })
	if after.BootID != before.BootID || after.Counter < before.Counter {
		t.Fatalf("guest after wake %+v, before %+v: rebooted or counter went back", after, before)
	}
	if err := wres.AfterCommit(ctx); err != nil {
		t.Fatal(err)
	}
	noEntry(t, filepath.Join(store, hres.SnapshotDir))

	// Destroy of a hibernated VM removes its snapshot.
	h2, err := d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), VM: vm, Key: testKey, RunDir: run})
	if err != nil {
		t.Fatal(err)
	}
	din := fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: run, SnapshotDir: h2.SnapshotDir}
	if _, err := d.Destroy(ctx, din); err != nil {
		t.Fatal(err)
	}
	noEntry(t, filepath.Join(store, h2.SnapshotDir))
	noEntry(t, runDir)

	// Cold tier: the guest booted straight into the VM's run dir; Destroy
	// stops it.
	vm2 := "vm-00000000000000c2"
	run2 := testInstance + "/" + vm2
	run2Dir := filepath.Join(root, "run", run2)
	cold := fsm.CloneVM{OpID: newOp(), VM: vm2, Key: testKey, Instance: testInstance, RunDir: run2, Cold: true}
	coldRes, err := d.Clone(ctx, cold)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(stepNames(coldRes), StepReady) || slices.Contains(stepNames(coldRes), StepIncoming) {
		t.Fatalf("cold boot steps %v", stepNames(coldRes))
	}
	if m, err := os.Stat(filepath.Join(run2Dir, FileRAM)); err != nil || m.Size() != 256<<20 {
		t.Fatalf("cold boot RAM file: %v", err)
	}
	boot1 := guestDo(t, ctx, run2Dir, func(a *agent.Client) (agent.Uptime, error) { return a.Uptime(ctx) })

	// Start-up reconcile after a restart: the VM is adopted and watched; a
	// paused one is resumed first.
	d = restart()
	exits := make(chan Exit, 4)
	d.OnExit(func(e Exit) { exits <- e })
	if dirs, err := d.RunDirs(); err != nil || !slices.Contains(dirs, vm2) {
		t.Fatalf("RunDirs = %v, %v", dirs, err)
	}
	if d.GoldenRunDir(gop) != filepath.Base(d.roots.GoldenRunDir(d.instance, gop)) || d.InstanceRoot() != filepath.Join(root, "run", testInstance) {
		t.Fatalf("GoldenRunDir %s, InstanceRoot %s", d.GoldenRunDir(gop), d.InstanceRoot())
	}
	l, err := d.AdoptVM(ctx, vm2, run2)
	if err != nil || !l.Alive || l.Pid != vmPID(t, d, run2Dir) {
		t.Fatalf("AdoptVM = %+v, %v", l, err)
	}
	qmpStop(t, ctx, run2Dir).Close()
	l, err = d.AdoptVM(ctx, vm2, run2)
	if err != nil || !l.Alive || l.Detail != "resumed from paused" {
		t.Fatalf("AdoptVM of a paused VM = %+v, %v", l, err)
	}
	if st, err := d.Recipes().Status(ctx, Spec{RunDir: run2Dir, StoreDir: store}); err != nil || st != "running" {
		t.Fatalf("after AdoptVM: %q, %v", st, err)
	}

	// The VM's QEMU dies on its own: OnExit tells, AdoptVM finds it dead, and
	// Restart boots it again, cold.
	if err := syscall.Kill(l.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-exits:
		if e.VM != vm2 || e.Pid != l.Pid || e.RunDir != run2Dir {
			t.Fatalf("exit %+v, want VM %s pid %d", e, vm2, l.Pid)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnExit never reported the killed QEMU")
	}
	waitNoQEMU(t, run2Dir, 5*time.Second)
	if l, err := d.AdoptVM(ctx, vm2, run2); err != nil || l.Alive {
		t.Fatalf("AdoptVM of a dead VM = %+v, %v", l, err)
	}
	rin := fsm.RestartVM{OpID: newOp(), Claim: "sb_2", VM: vm2, Key: testKey, Instance: testInstance, RunDir: run2}
	if _, err := d.Restart(ctx, rin); err != nil {
		t.Fatal(err)
	}
	pid2 := vmPID(t, d, run2Dir)
	if _, err := restart().Restart(ctx, rin); err != nil {
		t.Fatalf("re-run Restart: %v", err)
	}
	if p := vmPID(t, d, run2Dir); p != pid2 {
		t.Fatalf("re-run Restart replaced the VM: pid %d, was %d", p, pid2)
	}
	if boot2 := guestDo(t, ctx, run2Dir, func(a *agent.Client) (agent.Uptime, error) { return a.Uptime(ctx) }); boot2.BootID == boot1.BootID {
		t.Fatalf("restarted guest kept its boot id %s", boot2.BootID)
	}

	// A run dir no state owns goes, its QEMU stopped by the driver itself:
	// no exit is reported.
	if err := d.RemoveRunDir(ctx, vm2); err != nil {
		t.Fatal(err)
	}
	waitNoQEMU(t, run2Dir, 5*time.Second)
	noEntry(t, run2Dir)
	if _, err := restart().Destroy(ctx, fsm.DestroyVM{OpID: newOp(), VM: vm2, Key: testKey, Instance: testInstance, RunDir: run2}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-exits:
		t.Fatalf("exit reported for a QEMU the driver stopped: %+v", e)
	case <-time.After(200 * time.Millisecond):
	}
}

// dataPlaneInfo runs info through Driver.DialAgent on the VM of run.
func dataPlaneInfo(t *testing.T, ctx context.Context, d *Driver, run string) {
	t.Helper()
	c, err := d.DialAgent(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info, err := silkd.NewConn(c).Info(ctx); err != nil || info.Agent != "sbx-agent" {
		t.Fatalf("info through DialAgent(%s) = %+v, %v", run, info, err)
	}
}

func vmPID(t *testing.T, d *Driver, runDir string) int {
	t.Helper()
	pid, err := d.Recipes().Adopt(Spec{RunDir: runDir, StoreDir: filepath.Dir(runDir)})
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
