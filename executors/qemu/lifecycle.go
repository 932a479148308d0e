package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/qemu/qmp"
)

// migration capabilities on both ends: x-ignore-shared leaves RAM blocks backed by
// shared memory (our RAM file) out of the stream, since the file itself is the
// snapshot; events makes QEMU send MIGRATION events.
var migrationCaps = []string{"x-ignore-shared", "events"}

// migrationFD is the name under which the state file's descriptor is passed.
const migrationFD = "sbx-state"

// Boot cold-boots the VM of spec in spec.RunDir and waits until the guest agent
// answers; the VM keeps running. If the run dir already holds this VM's live QEMU,
// Boot does nothing and reports Already.
func (q *Recipes) Boot(ctx context.Context, spec Spec) (RecipeResult, error) {
	var r RecipeResult
	if err := spec.validateBoot(); err != nil {
		return r, err
	}
	if pid, err := q.adopt(spec.RunDir); err == nil {
		// A boot cut short by a crash: its VM counts once its agent answers.
		m, merr := launchedMeta(spec.RunDir)
		if merr == nil && q.waitAgent(ctx, spec.RunDir, q.bootTimeout, &r) == nil {
			r.PID, r.Already, r.Accel = pid, true, m.Accel
			return r, nil
		}
		if err := q.terminate(ctx, pid, spec.RunDir, nil); err != nil {
			return r, err
		}
	}
	accel, _ := q.Accel(ctx, spec)
	r.Accel = accel
	t := q.timer(&r)
	if err := q.fs.RemoveAll(spec.RunDir); err != nil {
		return r, err
	}
	if err := q.fs.MkdirAll(spec.RunDir, 0o700); err != nil {
		return r, err
	}
	if spec.Disk != "" {
		res, err := q.fs.Clone(filepath.Join(spec.RunDir, FileDisk), spec.Disk)
		if err != nil {
			return r, err
		}
		r.addClone(res)
	}
	t.mark(StepPrepare)
	pid, c, err := q.launch(ctx, spec.RunDir, q.bootMeta(spec, accel), false, spec.Egress)
	if err != nil {
		return r, err
	}
	c.Close()
	r.PID = pid
	t.mark(StepLaunch)
	if err := q.waitAgent(ctx, spec.RunDir, q.bootTimeout, &r); err != nil {
		q.abandon(pid, spec.RunDir)
		return r, err
	}
	t.mark(StepReady)
	return r, nil
}

// waitAgent waits up to timeout for the guest agent to answer "ready", sets
// the guest's clock (r.ClockOffset), then gives it the VM's data-plane key
// (every boot and restore: a restored guest remembers the key of the VM it
// was snapshotted from).
func (q *Recipes) waitAgent(ctx context.Context, runDir string, timeout time.Duration, r *RecipeResult) error {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	a, err := agent.WaitReady(actx, AgentSocket(runDir), 100*time.Millisecond)
	if err != nil {
		return fmt.Errorf("qemu: guest agent in %s: %w (console: %s)", runDir, err, consoleTail(runDir))
	}
	defer a.Close()
	if err := q.syncClock(actx, a, runDir, r); err != nil {
		return err
	}
	return q.armAgent(actx, a, runDir)
}

// syncClock sets the guest's wall clock to the host's
// (executors.SyncGuestClock, which every driver shares). Under TCG the
// restored guest's kernel catches up only as fast as the emulated RTC lets
// it, which leaves it minutes behind; the agent on the serial line is the
// channel. (kvm-clock would keep a KVM guest right by itself but does not
// exist under TCG, QEMU's RTC "base" follows the host only at boot, and
// rtc-reset-reinjection concerns lost ticks, not a restored snapshot.)
func (q *Recipes) syncClock(ctx context.Context, a *agent.Client, runDir string, r *RecipeResult) error {
	off, err := executors.SyncGuestClock(ctx, a, q.now(), q.log.With().Str("run_dir", runDir).Logger(), "qemu")
	if err != nil {
		return fmt.Errorf("qemu: guest in %s: %w", runDir, err)
	}
	r.ClockOffset = off
	return nil
}

func consoleTail(runDir string) string {
	b, err := os.ReadFile(filepath.Join(runDir, FileConsole))
	if err != nil {
		return "none"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, " | ")
}

// abandon stops a VM whose recipe failed and removes its run dir; it has its own
// deadline because the recipe's context may be what ended.
func (q *Recipes) abandon(pid int, runDir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*q.stopGrace)
	defer cancel()
	if err := q.terminate(ctx, pid, runDir, nil); err != nil {
		q.log.Error().Err(err).Str("run_dir", runDir).Msg("qemu: stopping a failed VM")
		return
	}
	if err := q.fs.RemoveAll(runDir); err != nil {
		q.log.Error().Err(err).Str("run_dir", runDir).Msg("qemu: removing a failed VM's run dir")
	}
}

// Golden builds the snapshot name in the store: cold boot, agent ready, stop, save
// the device state, clone RAM (and disk) into a temp dir of the store, SyncTree,
// rename into place; then the VM is stopped and its run dir removed. If the snapshot
// already exists, Golden does nothing and reports Already.
func (q *Recipes) Golden(ctx context.Context, spec Spec, name string) (RecipeResult, error) {
	if err := validateName(name); err != nil {
		return RecipeResult{}, err
	}
	if err := spec.validateBoot(); err != nil {
		return RecipeResult{}, err
	}
	if _, err := ReadMeta(spec.SnapshotDir(name)); err == nil {
		return RecipeResult{Already: true}, nil
	}
	r, err := q.Boot(ctx, spec)
	if err != nil {
		return r, err
	}
	pid := r.PID
	c, err := qmp.Dial(ctx, QMPSocket(spec.RunDir))
	if err != nil {
		q.abandon(pid, spec.RunDir)
		return r, fmt.Errorf("qemu: golden: %w", err)
	}
	defer c.Close()
	if err := q.snapshot(ctx, c, spec, name, sourceGolden, &r, nil); err != nil {
		q.abandon(pid, spec.RunDir)
		return r, err
	}
	err = q.finish(ctx, c, pid, spec.RunDir, &r)
	return r, err
}

// finish quits QEMU after a snapshot and removes the run dir.
func (q *Recipes) finish(ctx context.Context, c *qmp.Client, pid int, runDir string, r *RecipeResult) error {
	t := q.timer(r)
	if err := q.terminate(ctx, pid, runDir, c); err != nil {
		return err
	}
	t.mark(StepQuit)
	if err := q.fs.RemoveAll(runDir); err != nil {
		return err
	}
	t.mark(StepCleanup)
	return nil
}

// snapshot saves the running or paused VM behind c into the store as name, in
// the order that keeps a half-written snapshot invisible: stop; state into a
// fresh temp dir inside the store; clone RAM and disk next to it; meta.json;
// SyncTree; rename into place. A failure
// removes the temp dir, so no half snapshot is ever visible under name; resuming
// the VM is the caller's decision. cloned, when set, runs once RAM and disk
// are cloned, before meta.json: what the VM does from then on is not in the
// snapshot (SnapshotLive resumes it there). The snapshot's meta.json is the
// VM's launch Meta with source (sourceGolden, ...) and this QEMU's version.
func (q *Recipes) snapshot(ctx context.Context, c *qmp.Client, spec Spec, name, source string, r *RecipeResult, cloned func(t *timer) error) (err error) {
	m, err := launchedMeta(spec.RunDir)
	if err != nil {
		return err
	}
	m.Source = source
	m.QEMUVersion = c.Version().String()
	t := q.recipeTimer(r, source)
	// QEMU refuses to migrate a VM again from postmigrate (where a hibernate cut
	// short after its migration leaves it); running it for a moment first is as if
	// this hibernate had started a little later.
	if st, err := c.QueryStatus(ctx); err != nil {
		return fmt.Errorf("qemu: snapshot: %w", err)
	} else if st.Status == "postmigrate" {
		if err := c.Execute(ctx, "cont", nil, nil); err != nil {
			return fmt.Errorf("qemu: snapshot: cont from postmigrate: %w", err)
		}
	}
	if err := c.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("qemu: snapshot: %w", err)
	}
	t.mark(StepStop)

	tmp, err := q.fs.MkTempDir(spec.StoreDir, name)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if rerr := q.fs.RemoveAll(tmp); rerr != nil {
				q.log.Error().Err(rerr).Str("dir", tmp).Msg("qemu: removing a failed snapshot's temp dir")
			}
		}
	}()
	if m.StateBytes, err = q.saveState(ctx, c, filepath.Join(tmp, FileState)); err != nil {
		return err
	}
	r.StateBytes = m.StateBytes
	t.mark(StepMigrate)

	res, err := q.fs.Clone(filepath.Join(tmp, FileRAM), filepath.Join(spec.RunDir, FileRAM))
	if err != nil {
		return err
	}
	r.addClone(res)
	if m.Disk {
		res, err := q.fs.Clone(filepath.Join(tmp, FileDisk), filepath.Join(spec.RunDir, FileDisk))
		if err != nil {
			return err
		}
		r.addClone(res)
	}
	t.mark(StepClone)
	if cloned != nil {
		if err := cloned(t); err != nil {
			return err
		}
	}

	m.Created = q.now().UTC()
	m.Instance = q.instance
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := q.fs.WriteFileAtomic(filepath.Join(tmp, FileMeta), append(b, '\n'), 0o600); err != nil {
		return err
	}
	t.mark(StepMeta)
	if err := q.fs.SyncTree(tmp); err != nil {
		return err
	}
	t.mark(StepSync)
	if err := q.fs.RenameDir(tmp, spec.SnapshotDir(name)); err != nil {
		// RenameDir may have renamed and then failed to fsync the store. The
		// caller resumes the VM and reports the hibernate failed, which no
		// state records as a snapshot; left standing, it would make a re-run
		// quit the VM that ran on since. The rename refuses an existing
		// name, so a snapshot there with the temp dir gone is this one.
		if _, terr := os.Lstat(tmp); errors.Is(terr, os.ErrNotExist) {
			if rerr := q.fs.RemoveAll(spec.SnapshotDir(name)); rerr != nil {
				err = errors.Join(err, fmt.Errorf("qemu: removing the snapshot of a failed rename: %w", rerr))
			}
		}
		return err
	}
	t.mark(StepRename)
	return nil
}

// saveState migrates the (stopped) VM's device state into a new file at path and
// returns the file's size.
func (q *Recipes) saveState(ctx context.Context, c *qmp.Client, path string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, q.migrateTimeout)
	defer cancel()
	if err := c.SetMigrationCapabilities(ctx, migrationCaps...); err != nil {
		return 0, fmt.Errorf("qemu: save state: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("qemu: save state: %w", err)
	}
	err = c.GetFD(ctx, migrationFD, int(f.Fd()))
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("qemu: save state: %w", err)
	}
	sub := c.Subscribe("MIGRATION")
	defer sub.Close()
	if err := c.Execute(ctx, "migrate", map[string]any{"uri": "fd:" + migrationFD}, nil); err != nil {
		return 0, fmt.Errorf("qemu: save state: %w", err)
	}
	if err := waitMigration(ctx, c, sub); err != nil {
		return 0, fmt.Errorf("qemu: save state: %w", err)
	}
	// The migration thread reports "completed" a moment before it moves the run
	// state to postmigrate; a cont in between (resuming after a failed hibernate)
	// would be overridden and leave the VM stopped. Wait for postmigrate.
	for {
		st, err := c.QueryStatus(ctx)
		if err != nil {
			return 0, fmt.Errorf("qemu: save state: %w", err)
		}
		if st.Status == "postmigrate" {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("qemu: save state: run state still %q: %w", st.Status, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("qemu: save state: %w", err)
	}
	return st.Size(), nil
}

// waitMigration waits until the current migration (either direction) completes,
// woken by MIGRATION events and, in case one is missed, polling query-migrate.
func waitMigration(ctx context.Context, c *qmp.Client, sub *qmp.Subscription) error {
	for {
		mi, err := c.QueryMigrate(ctx)
		if err != nil {
			return err
		}
		switch mi.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("%w: %s: %s", ErrMigration, mi.Status, mi.ErrorDesc)
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = sub.Next(wctx)
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("%w: still %q: %w", ErrMigration, mi.Status, ctx.Err())
		}
		if errors.Is(err, qmp.ErrClosed) {
			return fmt.Errorf("%w: %w", ErrMigration, err)
		}
	}
}

// Hibernate saves the running VM of spec as snapshot name and stops it: stop, state
// into a temp dir in the store, clone RAM and disk, meta.json, SyncTree, rename,
// then quit QEMU and remove the run dir. If anything before the rename fails, the
// temp dir is removed and a VM that was running (or in postmigrate, left by an
// earlier hibernate cut short) is resumed; a paused one stays paused. If the snapshot
// already exists (a re-run after a crash past the rename), Hibernate only makes
// sure QEMU is gone and the run dir removed, and reports Already.
func (q *Recipes) Hibernate(ctx context.Context, spec Spec, name string) (RecipeResult, error) {
	var r RecipeResult
	if err := validateName(name); err != nil {
		return r, err
	}
	if err := spec.validateDirs(); err != nil {
		return r, err
	}
	if _, err := ReadMeta(spec.SnapshotDir(name)); err == nil {
		pid, err := q.adopt(spec.RunDir)
		if err != nil {
			r.Already = true
			return r, q.fs.RemoveAll(spec.RunDir)
		}
		// A live VM and a snapshot of that name: the snapshot is this hibernate's
		// only if it is newer than the VM's launch. Otherwise the name is reused
		// (the VM may even have been woken from it), and quitting would lose the VM.
		if !newerThanLaunch(spec.SnapshotDir(name), spec.RunDir) {
			return r, fmt.Errorf("%w: %s predates the VM in %s", ErrSnapshotExists, name, spec.RunDir)
		}
		r.Already = true
		return r, q.finish(ctx, nil, pid, spec.RunDir, &r)
	}
	pid, c, err := q.dialVM(ctx, spec, "hibernate")
	if err != nil {
		return r, err
	}
	defer c.Close()
	st, err := c.QueryStatus(ctx)
	if err != nil {
		return r, fmt.Errorf("qemu: hibernate: %w", err)
	}
	if err := q.snapshot(ctx, c, spec, name, sourceHibernate, &r, nil); err != nil {
		// Postmigrate: an earlier hibernate stopped it, and snapshot ran it again.
		if st.Running || st.Status == "postmigrate" {
			rctx, cancel := context.WithTimeout(context.Background(), q.stopGrace)
			defer cancel()
			if cerr := c.Execute(rctx, "cont", nil, nil); cerr != nil {
				err = errors.Join(err, fmt.Errorf("qemu: resuming after a failed hibernate: %w", cerr))
			}
		}
		return r, err
	}
	err = q.finish(ctx, c, pid, spec.RunDir, &r)
	return r, err
}

// Clone starts a new VM in spec.RunDir from the golden snapshot: clone RAM (and
// disk) from the golden into the run dir, launch QEMU with -incoming defer, load the
// device state, cont, wait for the agent. See restore for re-runs.
func (q *Recipes) Clone(ctx context.Context, spec Spec, golden string) (RecipeResult, error) {
	return q.restore(ctx, spec, golden)
}

// Wake restarts the hibernated VM of spec from snapshot name, like Clone. The
// snapshot is left in the store: it no longer backs anything once Wake returns (the
// run dir holds clones), so the caller may remove it at once.
func (q *Recipes) Wake(ctx context.Context, spec Spec, name string) (RecipeResult, error) {
	return q.restore(ctx, spec, name)
}

// restore runs the VM of spec from snapshot name. A live QEMU of this VM that is
// running already makes it a no-op (Already); one in any other state (a restore cut
// short) is stopped and the restore starts over. On failure QEMU is stopped and the
// run dir removed; the snapshot is never modified.
func (q *Recipes) restore(ctx context.Context, spec Spec, name string) (RecipeResult, error) {
	var r RecipeResult
	if err := validateName(name); err != nil {
		return r, err
	}
	if err := spec.validateDirs(); err != nil {
		return r, err
	}
	snap := spec.SnapshotDir(name)
	m, err := ReadMeta(snap)
	if err != nil {
		return r, err
	}
	r.Accel = m.Accel
	if pid, err := q.adopt(spec.RunDir); err == nil {
		if q.isRunning(ctx, spec.RunDir) {
			r.PID, r.Already = pid, true
			return r, nil
		}
		if err := q.terminate(ctx, pid, spec.RunDir, nil); err != nil {
			return r, err
		}
	}

	t := q.timer(&r)
	if err := q.fs.RemoveAll(spec.RunDir); err != nil {
		return r, err
	}
	if err := q.fs.MkdirAll(spec.RunDir, 0o700); err != nil {
		return r, err
	}
	t.mark(StepPrepare)
	files := []string{FileRAM}
	if m.Disk {
		files = append(files, FileDisk)
	}
	for _, f := range files {
		res, err := q.fs.Clone(filepath.Join(spec.RunDir, f), filepath.Join(snap, f))
		if err != nil {
			_ = q.fs.RemoveAll(spec.RunDir)
			return r, err
		}
		r.addClone(res)
	}
	t.mark(StepClone)

	pid, c, err := q.launch(ctx, spec.RunDir, m, true, spec.Egress)
	if err != nil {
		_ = q.fs.RemoveAll(spec.RunDir)
		return r, err
	}
	defer c.Close()
	r.PID = pid
	t.mark(StepLaunch)
	if r.StateBytes, err = q.loadState(ctx, c, filepath.Join(snap, FileState)); err != nil {
		q.abandon(pid, spec.RunDir)
		return r, err
	}
	t.mark(StepIncoming)
	if err := c.Execute(ctx, "cont", nil, nil); err != nil {
		q.abandon(pid, spec.RunDir)
		return r, fmt.Errorf("qemu: restore: %w", err)
	}
	t.mark(StepCont)
	if err := q.waitAgent(ctx, spec.RunDir, q.readyTimeout, &r); err != nil {
		q.abandon(pid, spec.RunDir)
		return r, err
	}
	t.mark(StepReady)
	return r, nil
}

// loadState feeds the state file at path to a QEMU started with -incoming defer.
func (q *Recipes) loadState(ctx context.Context, c *qmp.Client, path string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, q.migrateTimeout)
	defer cancel()
	if err := c.SetMigrationCapabilities(ctx, migrationCaps...); err != nil {
		return 0, fmt.Errorf("qemu: load state: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("qemu: load state: %w", err)
	}
	st, err := f.Stat()
	if err == nil {
		err = c.GetFD(ctx, migrationFD, int(f.Fd()))
	}
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("qemu: load state: %w", err)
	}
	sub := c.Subscribe("MIGRATION")
	defer sub.Close()
	if err := c.Execute(ctx, "migrate-incoming", map[string]any{"uri": "fd:" + migrationFD}, nil); err != nil {
		return 0, fmt.Errorf("qemu: load state: %w", err)
	}
	if err := waitMigration(ctx, c, sub); err != nil {
		return 0, fmt.Errorf("qemu: load state: %w", err)
	}
	return st.Size(), nil
}

// isRunning reports whether the VM in runDir answers QMP with status running.
func (q *Recipes) isRunning(ctx context.Context, runDir string) bool {
	ctx, cancel := context.WithTimeout(ctx, q.stopGrace)
	defer cancel()
	c, err := qmp.Dial(ctx, QMPSocket(runDir))
	if err != nil {
		return false
	}
	defer c.Close()
	st, err := c.QueryStatus(ctx)
	return err == nil && st.Running
}

// Resume makes the VM of spec run again after it was left stopped (a hibernate cut
// short by a crash before its rename leaves QEMU paused or in postmigrate): cont,
// then wait for the agent. A running VM is left alone (Already).
func (q *Recipes) Resume(ctx context.Context, spec Spec) (RecipeResult, error) {
	var r RecipeResult
	if err := spec.validateDirs(); err != nil {
		return r, err
	}
	pid, c, err := q.dialVM(ctx, spec, "resume")
	r.PID = pid
	if err != nil {
		return r, err
	}
	defer c.Close()
	st, err := c.QueryStatus(ctx)
	if err != nil {
		return r, fmt.Errorf("qemu: resume: %w", err)
	}
	if st.Running {
		r.Already = true
		return r, nil
	}
	t := q.timer(&r)
	if err := c.Execute(ctx, "cont", nil, nil); err != nil {
		return r, fmt.Errorf("qemu: resume from %q: %w", st.Status, err)
	}
	t.mark(StepCont)
	if err := q.waitAgent(ctx, spec.RunDir, q.readyTimeout, &r); err != nil {
		return r, err
	}
	t.mark(StepReady)
	return r, nil
}

// Destroy stops the VM of spec (QMP quit, then SIGTERM, then SIGKILL, each checked
// against the pid's cmdline) and removes its run dir. It succeeds when there is
// nothing to stop, so it can be re-run; snapshots in the store are not touched.
func (q *Recipes) Destroy(ctx context.Context, spec Spec) (RecipeResult, error) {
	var r RecipeResult
	if err := spec.validateDirs(); err != nil {
		return r, err
	}
	t := q.timer(&r)
	if pid, err := q.adopt(spec.RunDir); err == nil {
		if err := q.terminate(ctx, pid, spec.RunDir, nil); err != nil {
			return r, err
		}
		t.mark(StepQuit)
	} else if !errors.Is(err, ErrNotRunning) {
		return r, err
	}
	t.skip()
	if err := q.fs.RemoveAll(spec.RunDir); err != nil {
		return r, err
	}
	t.mark(StepCleanup)
	return r, nil
}

// Stop ends the VM's QEMU like Destroy (quit, SIGTERM, SIGKILL, each after the
// cmdline check) but keeps the run dir, whose logs tell why the VM was found not
// running. Nothing running is success.
func (q *Recipes) Stop(ctx context.Context, spec Spec) error {
	if err := spec.validateDirs(); err != nil {
		return err
	}
	pid, err := q.adopt(spec.RunDir)
	if errors.Is(err, ErrNotRunning) {
		return nil
	}
	if err != nil {
		return err
	}
	return q.terminate(ctx, pid, spec.RunDir, nil)
}

// Status returns QEMU's run state of the VM of spec ("running", "paused", ...), or
// an error wrapping ErrNotRunning when there is no process.
func (q *Recipes) Status(ctx context.Context, spec Spec) (string, error) {
	if err := spec.validateDirs(); err != nil {
		return "", err
	}
	_, c, err := q.dialVM(ctx, spec, "status")
	if err != nil {
		return "", err
	}
	defer c.Close()
	st, err := c.QueryStatus(ctx)
	return st.Status, err
}

// dialVM adopts the live QEMU of spec (see Adopt) and opens its QMP socket: the
// first step of every recipe that acts on a running VM. op names the recipe in the
// dial error. The pid is returned even when the dial fails, for the caller's result.
func (q *Recipes) dialVM(ctx context.Context, spec Spec, op string) (int, *qmp.Client, error) {
	pid, err := q.adopt(spec.RunDir)
	if err != nil {
		return 0, nil, err
	}
	c, err := qmp.Dial(ctx, QMPSocket(spec.RunDir))
	if err != nil {
		return pid, nil, fmt.Errorf("qemu: %s: %w", op, err)
	}
	return pid, c, nil
}

// newerThanLaunch reports whether the snapshot in snap was written after the VM in
// runDir was launched (its meta.json is younger than the run dir's vm.json).
func newerThanLaunch(snap, runDir string) bool {
	ms, err1 := os.Stat(filepath.Join(snap, FileMeta))
	vs, err2 := os.Stat(filepath.Join(runDir, FileVM))
	return err1 == nil && err2 == nil && !ms.ModTime().Before(vs.ModTime())
}
