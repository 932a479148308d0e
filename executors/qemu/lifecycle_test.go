package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/qemu/qmp"
)

const testMemMiB = 256

// vmEnv is a store and a run root on one filesystem, and TCG Recipes whose FS
// records every step.
type vmEnv struct {
	t     *testing.T
	root  string
	rec   *fsx.Recorder
	q     *Recipes
	guest guesttest.Guest
}

func newEnv(t *testing.T, mount func(t testing.TB) string) *vmEnv {
	t.Helper()
	g := guesttest.Require(t)
	root := mount(t)
	for _, d := range []string{"store", "run"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	e := &vmEnv{t: t, root: root, guest: g}
	e.rec = fsx.NewRecorder(fsx.NewOS(zerolog.Nop()))
	e.q = e.recipes()
	return e
}

func (e *vmEnv) recipes() *Recipes {
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, FS: e.rec, StopGrace: 3 * time.Second})
	if err != nil {
		e.t.Fatal(err)
	}
	return q
}

func mountXFS(t testing.TB) string { return xfstest.Mount(t, 4<<30) }

func (e *vmEnv) spec(name string) Spec {
	return Spec{
		RunDir:    filepath.Join(e.root, "run", name),
		StoreDir:  filepath.Join(e.root, "store"),
		MemoryMiB: testMemMiB,
		Kernel:    e.guest.Kernel,
		Initrd:    e.guest.Initrd,
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// dialAgent connects to the guest agent of spec.
func dialAgent(t *testing.T, ctx context.Context, spec Spec) *agent.Client {
	t.Helper()
	a, err := agent.Dial(ctx, AgentSocket(spec.RunDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// destroyOnCleanup makes sure no QEMU outlives a failed test, and shows the guest's
// console and QEMU's log when the test failed.
func (e *vmEnv) destroyOnCleanup(spec Spec) {
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := e.q.Destroy(ctx, spec); err != nil {
			e.t.Errorf("cleanup destroy: %v", err)
		}
	})
	e.t.Cleanup(func() {
		if !e.t.Failed() {
			return
		}
		for _, f := range []string{FileConsole, FileLog} {
			if b, err := os.ReadFile(filepath.Join(spec.RunDir, f)); err == nil {
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				e.t.Logf("%s of %s:\n%s", f, spec.RunDir, b)
			}
		}
	})
}

func processGone(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("QEMU pid %d still exists (kill 0: %v)", pid, err)
	}
}

// noTemp checks that the store holds no temp dir of a recipe.
func noTemp(t *testing.T, store string) {
	t.Helper()
	ents, err := os.ReadDir(store)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), fsx.TempPrefix) {
			t.Fatalf("temp dir %s left in the store", e.Name())
		}
	}
}

// Boot with a disk attached; the disk travels through a failed and a successful
// hibernate and a wake; Destroy leaves nothing behind.
func TestBootAgentDestroy(t *testing.T) {
	e := newEnv(t, mountXFS)
	ctx := ctxT(t, 3*time.Minute)
	spec := e.spec("boot")
	// As a template's: an overlay over a raw base image.
	base := filepath.Join(e.root, "base.raw")
	if err := os.WriteFile(base, []byte("sbx disk marker"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(base, 1<<20); err != nil {
		t.Fatal(err)
	}
	spec.Disk = qcow2Overlay(t, base)
	e.destroyOnCleanup(spec)

	r, err := e.q.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cold boot: %v (total %v)", r.Steps, r.Total())
	if r.Accel != AccelTCG || r.PID <= 0 || r.Dur(StepReady) <= 0 {
		t.Fatalf("result %+v", r)
	}
	if pid, err := e.q.Adopt(spec); err != nil || pid != r.PID {
		t.Fatalf("Adopt = %d, %v; want %d", pid, err, r.PID)
	}
	if st, err := e.q.Status(ctx, spec); err != nil || st != "running" {
		t.Fatalf("Status = %q, %v", st, err)
	}
	a := dialAgent(t, ctx, spec)
	up, err := a.Uptime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if up.Since <= 0 || up.BootID == "" {
		t.Fatalf("uptime %+v", up)
	}
	a.Close()

	// Boot again finds the running VM.
	if r2, err := e.q.Boot(ctx, spec); err != nil || !r2.Already || r2.PID != r.PID || r2.Accel != AccelTCG {
		t.Fatalf("second Boot = %+v, %v", r2, err)
	}

	// With a disk, a failed hibernate must reactivate QEMU's block devices
	// (inactivated by the completed migration) when it resumes the VM.
	e.rec.Before = func(s fsx.Step) error {
		if s.Op == fsx.OpSyncTree {
			return errors.New("injected")
		}
		return nil
	}
	_, err = e.q.Hibernate(ctx, spec, "disk")
	e.rec.Before = nil
	if err == nil {
		t.Fatal("hibernate with injected failure succeeded")
	}
	if st, err := e.q.Status(ctx, spec); err != nil || st != "running" {
		t.Fatalf("after failed hibernate with disk: %q, %v", st, err)
	}
	hr, err := e.q.Hibernate(ctx, spec, "disk")
	if err != nil {
		t.Fatal(err)
	}
	processGone(t, r.PID)
	snapDisk := filepath.Join(spec.SnapshotDir("disk"), FileDisk)
	if b, err := qcow2Backing(snapDisk); err != nil || b != base {
		t.Fatalf("snapshot disk's backing file: %q, %v; want %s", b, err, base)
	}
	if shared, err := fsx.AllExtentsShared(snapDisk); err != nil || !shared || hr.Method != fsx.Reflink {
		t.Fatalf("snapshot disk not reflinked: shared %v (%v), method %v", shared, err, hr.Method)
	}
	wr, err := e.q.Wake(ctx, spec, "disk")
	if err != nil {
		t.Fatal(err)
	}
	r.PID = wr.PID
	if b, err := qcow2Backing(filepath.Join(spec.RunDir, FileDisk)); err != nil || b != base {
		t.Fatalf("woken VM's disk's backing file: %q, %v; want %s", b, err, base)
	}
	if a, err := agent.Dial(ctx, AgentSocket(spec.RunDir)); err != nil {
		t.Fatal(err)
	} else if up2, err := a.Uptime(ctx); err != nil || up2.BootID != up.BootID {
		t.Fatalf("after wake with disk: %+v, %v (boot id was %s)", up2, err, up.BootID)
	} else {
		a.Close()
	}

	if _, err := e.q.Destroy(ctx, spec); err != nil {
		t.Fatal(err)
	}
	processGone(t, r.PID)
	noEntry(t, spec.RunDir)
	if _, err := e.q.Adopt(spec); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Adopt after Destroy = %v", err)
	}
	if _, err := e.q.Destroy(ctx, spec); err != nil {
		t.Fatalf("second Destroy = %v", err)
	}
}

// stepsAfter returns the recorded steps from index i on, as strings relative to root.
func (e *vmEnv) stepsAfter(i int) []string {
	var out []string
	for _, s := range e.rec.Steps()[i:] {
		p := make([]string, len(s.Paths))
		for j, x := range s.Paths {
			p[j] = strings.TrimPrefix(x, e.root+"/")
		}
		out = append(out, strings.TrimSpace(s.Op+" "+strings.Join(p, " ")))
	}
	return out
}

func TestGoldenCloneHibernateWake(t *testing.T) {
	e := newEnv(t, mountXFS)
	ctx := ctxT(t, 5*time.Minute)

	gspec := e.spec("golden-build")
	gr, err := e.q.Golden(ctx, gspec, "golden")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("golden: %v", gr.Steps)
	processGone(t, gr.PID)
	noEntry(t, gspec.RunDir)
	gm, err := ReadMeta(gspec.SnapshotDir("golden"))
	if err != nil {
		t.Fatal(err)
	}
	if gm.Source != "golden" || gm.Accel != AccelTCG || gm.MemoryMiB != testMemMiB || gm.StateBytes <= 0 {
		t.Fatalf("golden meta %+v", gm)
	}
	if again, err := e.q.Golden(ctx, gspec, "golden"); err != nil || !again.Already {
		t.Fatalf("second Golden = %+v, %v", again, err)
	}

	spec := e.spec("vm1")
	e.destroyOnCleanup(spec)
	cr, err := e.q.Clone(ctx, spec, "golden")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clone: %v", cr.Steps)
	if cr.Method != fsx.Reflink || cr.CopiedBytes != 0 {
		t.Fatalf("clone on XFS: method %v, copied %d", cr.Method, cr.CopiedBytes)
	}
	a := dialAgent(t, ctx, spec)
	sum, err := a.Write(ctx, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := a.Sha(ctx); err != nil || got != sum {
		t.Fatalf("sha after write = %q, %v; want %q", got, err, sum)
	}
	before, err := a.Uptime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()

	// A hibernate that fails before the rename leaves no snapshot and no temp dir,
	// and the VM runs on with its memory intact: after the migration (clone step)
	// QEMU is in postmigrate, after the clone its RAM has shared extents.
	for _, failAt := range []string{fsx.OpClone, fsx.OpSyncTree, fsx.OpRename} {
		errInjected := errors.New("injected failure at " + failAt)
		e.rec.Before = func(s fsx.Step) error {
			if s.Op == failAt {
				return errInjected
			}
			return nil
		}
		_, err := e.q.Hibernate(ctx, spec, "failed")
		e.rec.Before = nil
		if !errors.Is(err, errInjected) {
			t.Fatalf("hibernate failing at %s = %v", failAt, err)
		}
		noEntry(t, spec.SnapshotDir("failed"))
		noTemp(t, spec.StoreDir)
		if st, err := e.q.Status(ctx, spec); err != nil || st != "running" {
			t.Fatalf("after failure at %s: status %q, %v; want running", failAt, st, err)
		}
		a := dialAgent(t, ctx, spec)
		if got, err := a.Sha(ctx); err != nil || got != sum {
			t.Fatalf("after failure at %s: sha %q, %v", failAt, got, err)
		}
		a.Close()
	}
	// A rename that lands and then fails (the store's fsync) is a failed
	// hibernate too: the VM runs on, so the snapshot must go with the
	// rollback (a re-run finding it would quit the VM for a stale image).
	inner := e.rec.FS
	e.rec.FS = renameLandsThenFails{FS: inner}
	_, err = e.q.Hibernate(ctx, spec, "landed")
	e.rec.FS = inner
	if !errors.Is(err, errStoreSync) {
		t.Fatalf("hibernate whose rename failed after landing = %v", err)
	}
	noEntry(t, spec.SnapshotDir("landed"))
	noTemp(t, spec.StoreDir)
	if st, err := e.q.Status(ctx, spec); err != nil || st != "running" {
		t.Fatalf("after a rename that landed and failed: status %q, %v; want running", st, err)
	}
	la := dialAgent(t, ctx, spec)
	if got, err := la.Sha(ctx); err != nil || got != sum {
		t.Fatalf("after a rename that landed and failed: sha %q, %v", got, err)
	}
	la.Close()
	if pid, err := e.q.Adopt(spec); err != nil || pid != cr.PID {
		t.Fatalf("after failed hibernates: pid %d, %v; want %d", pid, err, cr.PID)
	}

	// A daemon killed in the middle of a hibernate, after the migration and before
	// the rename, leaves QEMU in postmigrate and a temp dir in the store. After the
	// restart (a new Recipes, SweepTemp) reconcile either resumes the VM or re-runs
	// the hibernate; both must work and keep the guest's memory.
	for _, then := range []string{"resume", "hibernate again"} {
		crashMidHibernate(t, ctx, e.q, spec)
		if _, err := fsx.SweepTemp(spec.StoreDir); err != nil {
			t.Fatal(err)
		}
		noTemp(t, spec.StoreDir)
		q := e.recipes()
		if st, err := q.Status(ctx, spec); err != nil || st != "postmigrate" {
			t.Fatalf("after the crash: status %q, %v", st, err)
		}
		switch then {
		case "resume":
			if _, err := q.Resume(ctx, spec); err != nil {
				t.Fatalf("resume after crash: %v", err)
			}
			if again, err := q.Resume(ctx, spec); err != nil || !again.Already {
				t.Fatalf("second Resume = %+v, %v", again, err)
			}
		case "hibernate again":
			if _, err := q.Hibernate(ctx, spec, "after-crash"); err != nil {
				t.Fatalf("hibernate after crash: %v", err)
			}
			wr, err := q.Wake(ctx, spec, "after-crash")
			if err != nil {
				t.Fatalf("wake after crash: %v", err)
			}
			cr.PID = wr.PID
			if err := os.RemoveAll(spec.SnapshotDir("after-crash")); err != nil {
				t.Fatal(err)
			}
		}
		a := dialAgent(t, ctx, spec)
		if got, err := a.Sha(ctx); err != nil || got != sum {
			t.Fatalf("after crash and %s: sha %q, %v", then, got, err)
		}
		a.Close()
	}

	pid := cr.PID
	for gen := 1; gen <= 3; gen++ {
		name := "hib-" + string(rune('0'+gen))
		// The second generation hibernates through a fresh Recipes, as after a
		// daemon restart: the VM is found through its pid file and cmdline.
		q := e.q
		if gen == 2 {
			q = e.recipes()
		}
		mark := len(e.rec.Steps())
		hr, err := q.Hibernate(ctx, spec, name)
		if err != nil {
			t.Fatalf("gen %d: hibernate: %v", gen, err)
		}
		t.Logf("gen %d hibernate: %v (state %d B)", gen, hr.Steps, hr.StateBytes)
		if hr.Method != fsx.Reflink {
			t.Fatalf("gen %d: hibernate cloned by %v", gen, hr.Method)
		}
		processGone(t, pid)
		noEntry(t, spec.RunDir)
		noTemp(t, spec.StoreDir)
		snap := spec.SnapshotDir(name)
		for _, f := range []string{FileRAM, FileState, FileMeta} {
			if _, err := os.Stat(filepath.Join(snap, f)); err != nil {
				t.Fatalf("gen %d: snapshot: %v", gen, err)
			}
		}
		// The snapshot order: temp dir in the store, clone, meta, SyncTree, rename,
		// and only then the run dir goes.
		steps := e.stepsAfter(mark)
		var ops []string
		for _, s := range steps {
			ops = append(ops, strings.Fields(s)[0])
		}
		want := []string{fsx.OpMkTempDir, fsx.OpClone, fsx.OpWrite, fsx.OpSyncTree, fsx.OpRename, fsx.OpRemoveAll}
		if !slices.Equal(ops, want) {
			t.Fatalf("gen %d: hibernate steps %q, want ops %v", gen, steps, want)
		}
		if !strings.HasSuffix(steps[4], "store/"+name) || !strings.HasSuffix(steps[5], "run/vm1") {
			t.Fatalf("gen %d: rename/remove paths %q", gen, steps)
		}
		if again, err := q.Hibernate(ctx, spec, name); err != nil || !again.Already {
			t.Fatalf("gen %d: second Hibernate = %+v, %v", gen, again, err)
		}

		wr, err := q.Wake(ctx, spec, name)
		if err != nil {
			t.Fatalf("gen %d: wake: %v", gen, err)
		}
		t.Logf("gen %d wake: %v", gen, wr.Steps)
		if wr.Method != fsx.Reflink {
			t.Fatalf("gen %d: wake cloned by %v", gen, wr.Method)
		}
		pid = wr.PID
		if again, err := q.Wake(ctx, spec, name); err != nil || !again.Already || again.PID != pid {
			t.Fatalf("gen %d: second Wake = %+v, %v", gen, again, err)
		}
		a := dialAgent(t, ctx, spec)
		got, err := a.Sha(ctx)
		if err != nil || got != sum {
			t.Fatalf("gen %d: sha after wake = %q, %v; want %q", gen, got, err, sum)
		}
		after, err := a.Uptime(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		if after.BootID != before.BootID {
			t.Fatalf("gen %d: guest rebooted: boot id %s, was %s", gen, after.BootID, before.BootID)
		}
		if after.Counter < before.Counter || after.Since < before.Since {
			t.Fatalf("gen %d: counter/uptime went back: %+v after %+v", gen, after, before)
		}
		// The counter continued from where it stopped: it counts guest run time
		// only, so it can never have advanced more than the guest's uptime allows.
		if dc, du := after.Counter-before.Counter, after.Since-before.Since; time.Duration(dc)*agent.Tick > du+2*agent.Tick {
			t.Fatalf("gen %d: counter advanced %d ticks in %v of guest uptime", gen, dc, du)
		}
		t.Logf("gen %d: counter %d -> %d, uptime %v -> %v", gen, before.Counter, after.Counter, before.Since, after.Since)
		before = after
		// The snapshot still exists and the VM was woken from it: hibernating
		// under the same name must refuse rather than take it for done.
		if _, err := q.Hibernate(ctx, spec, name); !errors.Is(err, ErrSnapshotExists) {
			t.Fatalf("gen %d: Hibernate onto the snapshot it was woken from = %v", gen, err)
		}
		if st, err := q.Status(ctx, spec); err != nil || st != "running" {
			t.Fatalf("gen %d: after refused hibernate: %q, %v", gen, st, err)
		}
		if err := os.RemoveAll(snap); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := e.q.Destroy(ctx, spec); err != nil {
		t.Fatal(err)
	}
	processGone(t, pid)
	noEntry(t, spec.RunDir)
}

func mountExt4(t testing.TB) string { return xfstest.MountNoReflink(t, 2<<30, xfstest.Ext4) }

// On a filesystem without reflink every clone is a copy, and the recipes say so.
func TestCopyFallbackWithoutReflink(t *testing.T) {
	e := newEnv(t, mountExt4)
	ctx := ctxT(t, 5*time.Minute)
	gspec := e.spec("golden-build")
	gr, err := e.q.Golden(ctx, gspec, "golden")
	if err != nil {
		t.Fatal(err)
	}
	if gr.Method != fsx.Copy || gr.CopiedBytes <= 0 {
		t.Fatalf("golden on ext4: method %v, copied %d", gr.Method, gr.CopiedBytes)
	}
	spec := e.spec("vm1")
	e.destroyOnCleanup(spec)
	cr, err := e.q.Clone(ctx, spec, "golden")
	if err != nil {
		t.Fatal(err)
	}
	a := dialAgent(t, ctx, spec)
	sum, err := a.Write(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	hr, err := e.q.Hibernate(ctx, spec, "hib")
	if err != nil {
		t.Fatal(err)
	}
	processGone(t, cr.PID)
	wr, err := e.q.Wake(ctx, spec, "hib")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ext4: clone %v; hibernate %v; wake %v", cr.Steps, hr.Steps, wr.Steps)
	for what, r := range map[string]RecipeResult{"clone": cr, "hibernate": hr, "wake": wr} {
		if r.Method != fsx.Copy || r.CopiedBytes <= 0 {
			t.Fatalf("%s on ext4: method %v, copied %d", what, r.Method, r.CopiedBytes)
		}
	}
	a = dialAgent(t, ctx, spec)
	if got, err := a.Sha(ctx); err != nil || got != sum {
		t.Fatalf("sha after wake on ext4 = %q, %v; want %q", got, err, sum)
	}
}

// crashMidHibernate does what Hibernate does up to the end of the migration, into a
// temp dir of the store, and stops there as a killed daemon would.
func crashMidHibernate(t *testing.T, ctx context.Context, q *Recipes, spec Spec) {
	t.Helper()
	c, err := qmp.Dial(ctx, QMPSocket(spec.RunDir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Execute(ctx, "stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	tmp, err := fsx.MkTempDir(spec.StoreDir, "crashed")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.saveState(ctx, c, filepath.Join(tmp, FileState)); err != nil {
		t.Fatal(err)
	}
}

// errStoreSync is the fsync failure renameLandsThenFails reports.
var errStoreSync = errors.New("test: fsync of the store failed after the rename")

// renameLandsThenFails renames, then fails as fsx.RenameDir does when the
// parent's fsync fails: the directory is in place and the call reports an
// error.
type renameLandsThenFails struct{ fsx.FS }

func (f renameLandsThenFails) RenameDir(oldpath, newpath string) error {
	if err := f.FS.RenameDir(oldpath, newpath); err != nil {
		return err
	}
	return errStoreSync
}
