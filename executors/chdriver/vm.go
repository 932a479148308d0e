package chdriver

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/probe"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/executors/vmm"
	"github.com/sbxlog/sbxlog/fsm"
)

// NetEgress is the pool net that gives each VM a tap.
const NetEgress = "egress"

// NICID is the id of the NIC an egress VM gets after its restore.
const NICID = "sbxnet0"

// MAC returns the NIC's MAC address of a VM: locally administered, unicast,
// derived from the VM id, so clones of one golden never share one.
func MAC(vm string) string {
	sum := sha256.Sum256([]byte("mac/" + vm))
	hw := net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}
	return hw.String()
}

// TapName is the tap of egress VM vm of the sandboxd instance.
func TapName(instance, vm string) string { return tap.Name(instance, vm) }

// tapName is the tap of this driver's egress VM vm.
func (d *Driver) tapName(vm string) string { return TapName(d.instance, vm) }

func (d *Driver) checkEgress(k fsm.PoolKey) (bool, error) {
	if k.Net != NetEgress {
		return false, nil
	}
	if err := d.netSupported(k); err != nil {
		return true, executors.AsUnrecoverable(fmt.Errorf("pool %s: %w", k, err))
	}
	return true, nil
}

// shutdown asks the VM to shut down before its VMM is terminated. A failure
// is logged, not returned: termination escalates to signals anyway, and by
// now the VM's state is safe (in the store, or not wanted).
func (r *run) shutdown(api API) error {
	ctx, cancel := context.WithTimeout(r.ctx, r.d.grace)
	defer cancel()
	if err := ignoreStopped(api.Shutdown(ctx)); err != nil {
		r.log.Warn().Err(err).Msg("vm.shutdown failed; terminating the VMM anyway")
	}
	return nil
}

// ignoreStopped turns the answers of a VM or VMM that is already stopped
// into success, for the idempotent stop steps.
func ignoreStopped(err error) error {
	if err == nil || ch.IsVMMGone(err) || ch.IsInvalidState(err) || ch.IsNotFound(err) {
		return nil
	}
	return err
}

// probe is the last step of every recipe that boots or restores a VM
// (clone from a golden or a checkpoint, cold boot, wake, restart, golden
// build, and the adoption of an interrupted one): waitReady, then the
// guest's clock set to the host's (syncClock) over the connection the
// probe reached the agent on, within timeout.
func (d *Driver) probe(r *run, api API, runDir string, timeout time.Duration) error {
	return r.step(StepProbe, func() error {
		ctx, cancel := context.WithTimeout(r.ctx, timeout)
		defer cancel()
		c, err := d.waitReady(ctx, api, runDir)
		if err != nil {
			return err
		}
		a := agent.NewClient(c)
		defer a.Close()
		return d.syncClock(ctx, a, r.log, runDir)
	})
}

// syncClock sets the guest's wall clock to the host's through its control
// agent a, on vsock port d.port (the protocol of executors/guest/agent),
// with the code every driver shares (executors.SyncGuestClock): a restored
// guest's clock resumes from its snapshot, since CH carries the KVM clock
// in it (and stops it while the VM is paused). The correction is logged
// (at info from a second on); there is no result field for it, as
// executors.Result carries none. A brief pause for a live checkpoint is
// not synced: it costs the guest only its length.
func (d *Driver) syncClock(ctx context.Context, a *agent.Client, log zerolog.Logger, runDir string) error {
	_, err := executors.SyncGuestClock(ctx, a, d.now(), log.With().Str("run_dir", runDir).Logger(), "chdriver")
	return err
}

// waitReady is the readiness probe: vm.info Running, then the guest agent
// answers a hybrid-vsock CONNECT, retried every 20 ms. It returns that
// connection to the agent, open: the caller's to close. ctx bounds it.
func (d *Driver) waitReady(ctx context.Context, api API, runDir string) (*net.UnixConn, error) {
	running := func(ctx context.Context) (bool, error) {
		info, err := api.Info(ctx)
		switch {
		case err != nil && ch.IsVMMGone(err):
			return false, err
		case err != nil:
			return false, nil
		case info.State == ch.StateRunning:
			return true, nil
		case info.State == ch.StateShutdown:
			return false, errors.New("the VM shut down")
		}
		return false, nil
	}
	c, _, err := probe.ReadyConn(ctx, running, filepath.Join(runDir, VsockFile), d.port, probe.Options{})
	return c, err
}

// teardown rolls a VM's run dir back to nothing: its VMM, tap and files.
// An egress tap goes before its lock, and the lock stays when the VMM could
// not be stopped (or its pid not be read) or the tap not be deleted: a guest
// that may still run is never on an unlocked tap. A lock left behind (a
// failed clone's VM is dropped from the state, so no destroy follows) keeps
// its table and door port until the next start-up reconcile removes both
// (the kernel keeps a netdev table whose device is gone).
func (d *Driver) teardown(r *run, vm, runDir string, egress bool) {
	d.closeDoors(vm)
	stopped := r.undo("undo_"+StepTerminate, func(ctx context.Context) error {
		p, err := d.attach(ctx, runDir, vm)
		if p == nil {
			return err
		}
		return d.terminate(ctx, runDir, p)
	}) == nil
	if egress {
		deleted := r.undo("undo_"+StepTapDelete, func(context.Context) error { return d.taps.Delete(d.tapName(vm)) }) == nil
		if stopped && deleted {
			r.undo("undo_"+StepEgressUnlock, func(context.Context) error { return d.unlockTap(vm) })
		} else {
			r.log.Warn().Str("vm", vm).Bool("vmm_stopped", stopped).Bool("tap_deleted", deleted).Msg("keeping the tap's lock: its VMM may still run, or its tap is still there")
		}
	}
	r.undo("undo_"+StepRemoveRun, func(context.Context) error { return d.fs.RemoveAll(runDir) })
}

// finishExisting looks for a VMM already serving runDir (a re-run after a
// crash). A VM that is Running, or Paused after its restore, is finished
// (NIC, resume, probe) and done is true. Anything else found is stopped and
// done is false: the caller starts over. On error the run dir is torn down.
func (d *Driver) finishExisting(r *run, vm, runDir string, egress, nic bool) (done bool, err error) {
	var proc *vmm.Process
	var info *ch.VmInfo
	api := d.api(runDir)
	err = r.step(StepAdopt, func() error {
		p, aerr := d.attach(r.ctx, runDir, vm)
		proc = p
		if p != nil && aerr == nil {
			info, _ = api.Info(r.ctx)
		}
		return nil
	})
	if err != nil || proc == nil {
		return false, err
	}
	if info == nil || (info.State != ch.StateRunning && info.State != ch.StatePaused) {
		r.log.Info().Str("run_dir", runDir).Msg("stopping the leftover VMM of an interrupted attempt")
		return false, r.step(StepTerminate, func() error { return d.terminate(r.ctx, runDir, proc) })
	}
	r.log.Info().Str("run_dir", runDir).Str("state", string(info.State)).Msg("adopting the VM of an interrupted attempt")
	fail := func(err error) (bool, error) {
		d.teardown(r, vm, runDir, egress)
		return false, err
	}
	if egress {
		if err := d.lockTap(r, vm); err != nil {
			return fail(err)
		}
	}
	if err := d.resumeAndProbe(r, api, vm, runDir, nic, info.State == ch.StatePaused); err != nil {
		return fail(err)
	}
	return true, nil
}

// swapNIC gives a restored egress VM its own NIC: devices inherited from the
// snapshot are removed and one with this VM's tap and MAC is added. Both
// halves tolerate a re-run.
func (d *Driver) swapNIC(ctx context.Context, api API, vm string) error {
	info, err := api.Info(ctx)
	if err != nil {
		return err
	}
	have := false
	if info.Config != nil {
		for _, id := range info.Config.NetIDs() {
			if id == NICID {
				have = true
				continue
			}
			if err := api.RemoveDevice(ctx, id); err != nil && !ch.IsNotFound(err) {
				return err
			}
		}
	}
	if have {
		return nil
	}
	_, err = api.AddNet(ctx, ch.NetConfig{ID: NICID, Tap: d.tapName(vm), Mac: MAC(vm)})
	if ch.IsConflict(err) {
		return nil
	}
	return err
}

// rewriteConfig points a snapshot's config at this VM's run dir: the disk,
// the vsock socket, serial and console files and the tap. Unknown keys are
// kept (ch.VmConfig is a JSON tree).
func rewriteConfig(cfg *ch.VmConfig, runDir, tapName string, egress bool) error {
	if len(cfg.DiskPaths()) == 0 {
		return errors.New("snapshot config has no disk")
	}
	if err := cfg.SetDiskPath(0, filepath.Join(runDir, DiskFile)); err != nil {
		return err
	}
	if cfg.VsockSocket() != "" {
		if err := cfg.SetVsockSocket(filepath.Join(runDir, VsockFile)); err != nil {
			return err
		}
	}
	if m, _ := cfg.Get("serial", "mode"); m == "File" {
		cfg.SetSerialFile(filepath.Join(runDir, SerialFile))
	}
	if m, _ := cfg.Get("console", "mode"); m == "File" {
		cfg.SetConsoleFile(filepath.Join(runDir, ConsoleFile))
	}
	taps := cfg.NetTaps()
	switch {
	case len(taps) == 0:
	case !egress:
		return executors.Unrecoverablef("snapshot has %d NICs but the pool has no egress", len(taps))
	case len(taps) > 1:
		return executors.Unrecoverablef("snapshot has %d NICs; an egress VM has one", len(taps))
	default:
		if err := cfg.SetNetTap(0, tapName); err != nil {
			return err
		}
	}
	return nil
}

// restoreInto makes vm run in runDir from the snapshot in src: the shared
// body of Clone (nic: give it its own NIC) and Wake. A VM already running
// there from an interrupted attempt is adopted. On error the run dir is
// torn down; src is only read.
func (d *Driver) restoreInto(r *run, vm string, k fsm.PoolKey, runDir, src string, nic bool) error {
	egress, err := d.checkEgress(k)
	if err != nil {
		return err
	}
	done, err := d.finishExisting(r, vm, runDir, egress, nic && egress)
	if err != nil || done {
		if done {
			d.openDoors(r, vm, runDir)
		}
		return err
	}
	if err := r.step(StepCheck, func() error { _, err := ReadMeta(src); return err }); err != nil {
		return err
	}
	restore := filepath.Join(runDir, RestoreDir)
	if err := d.resetRun(r, vm, runDir, restore); err != nil {
		return err
	}
	fail := func(err error) error {
		d.teardown(r, vm, runDir, egress)
		return err
	}
	if err := r.step(StepLinkMemory, func() error {
		return d.fs.Link(filepath.Join(restore, MemoryFile), filepath.Join(src, MemoryFile))
	}); err != nil {
		return fail(err)
	}
	if err := r.step(StepCloneDisk, func() error {
		res, err := d.fs.Clone(filepath.Join(runDir, DiskFile), filepath.Join(src, DiskFile), fsx.Overwrite())
		r.noteClone(res.Method)
		return err
	}); err != nil {
		return fail(err)
	}
	// The run dir's files are not fsynced: a host crash takes the VM with
	// it and a re-run starts the run dir over, while a daemon crash leaves
	// the page cache intact. Only the store is made durable.
	if err := r.step(StepWriteState, func() error {
		_, err := d.fs.Clone(filepath.Join(restore, StateFile), filepath.Join(src, StateFile), fsx.Overwrite())
		return err
	}); err != nil {
		return fail(err)
	}
	var cfg *ch.VmConfig
	if err := r.step(StepWriteConfig, func() error {
		data, err := os.ReadFile(filepath.Join(src, ConfigFile))
		if err != nil {
			return err
		}
		if cfg, err = ch.ParseConfig(data); err != nil {
			return executors.AsUnrecoverable(err)
		}
		if err := rewriteConfig(cfg, runDir, d.tapName(vm), egress); err != nil {
			return err
		}
		out, err := cfg.MarshalJSON()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(restore, ConfigFile), out, 0o600)
	}); err != nil {
		return fail(err)
	}
	if egress {
		if err := r.step(StepTapCreate, func() error { return d.taps.Create(d.tapName(vm), d.bridge) }); err != nil {
			return fail(err)
		}
		if err := d.lockTap(r, vm); err != nil {
			return fail(err)
		}
	}
	if err := r.step(StepLaunch, func() error { _, err := d.launch(r.ctx, runDir, vm); return err }); err != nil {
		return fail(err)
	}
	api := d.api(runDir)
	if err := r.step(StepRestore, func() error {
		url, err := ch.FileURL(restore)
		if err != nil {
			return err
		}
		return api.Restore(r.ctx, ch.RestoreConfig{SourceURL: url, MemoryRestoreMode: d.restoreMode(cfg)})
	}); err != nil {
		return fail(err)
	}
	if err := d.resumeAndProbe(r, api, vm, runDir, nic && egress, true); err != nil {
		return fail(err)
	}
	d.openDoors(r, vm, runDir)
	return nil
}

// resumeAndProbe finishes a restored VM: its own NIC when nic, vm.resume
// when resume (it is paused), then the readiness probe.
func (d *Driver) resumeAndProbe(r *run, api API, vm, runDir string, nic, resume bool) error {
	if nic {
		if err := r.step(StepNIC, func() error { return d.swapNIC(r.ctx, api, vm) }); err != nil {
			return err
		}
	}
	if resume {
		if err := r.step(StepResume, func() error { return api.Resume(r.ctx) }); err != nil {
			return err
		}
	}
	return d.probe(r, api, runDir, d.readyTO)
}

// resetRun starts a run dir over: a VMM left there by an interrupted
// attempt is stopped, the dir removed and dir (runDir or a subdir)
// recreated.
func (d *Driver) resetRun(r *run, id, runDir, dir string) error {
	return r.step(StepResetRun, func() error {
		p, err := d.attach(r.ctx, runDir, id)
		if p != nil {
			if err := d.terminate(r.ctx, runDir, p); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		if err := d.fs.RemoveAll(runDir); err != nil {
			return err
		}
		return d.fs.MkdirAll(dir, 0o700)
	})
}

// stopVM ends a VM whose state is safe elsewhere (hibernate after the
// rename, a golden build): vm.shutdown, then the VMM, the tap, its lock and
// the run dir. Every step tolerates what is already gone.
func (d *Driver) stopVM(r *run, vm, runDir string, egress bool) error {
	d.closeDoors(vm)
	p, err := d.attach(r.ctx, runDir, vm)
	if p == nil && err != nil {
		return fmt.Errorf("%s: %w", r.recipe, err)
	}
	if p != nil {
		api := d.api(runDir)
		if err := r.step(StepShutdown, func() error { return r.shutdown(api) }); err != nil {
			return err
		}
		if err := r.step(StepTerminate, func() error { return d.terminate(r.ctx, runDir, p) }); err != nil {
			return err
		}
	}
	if egress {
		if err := r.step(StepTapDelete, func() error { return d.taps.Delete(d.tapName(vm)) }); err != nil {
			return err
		}
		if err := r.step(StepEgressUnlock, func() error { return d.unlockTap(vm) }); err != nil {
			return err
		}
	}
	return r.step(StepRemoveRun, func() error { return d.fs.RemoveAll(runDir) })
}
