package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// The end-to-end tests of issue 9: the sandboxd binary with hypervisor qemu
// (TCG) on a loop-mounted XFS data dir, driven through its HTTP API, with the
// guest's data checked through its agent. One daemon data dir (one golden
// build) serves both acceptance scenarios:
//
//  1. pool warm 1, claim, 8 MiB of random data in the guest's tmpfs, three
//     hibernate/wake generations (QEMU gone and the snapshot in the store while
//     hibernated; same sha256, same boot, counter continued after each wake),
//     release, and the VM's QEMU and run dir gone;
//  2. sandboxd SIGKILLed in the middle of a hibernate (right after the request,
//     and once the snapshot's temp dir appears in the store), restarted on the
//     same data dir: the claim ends hibernated with an intact snapshot or
//     running, and the data survives a wake.
func TestSandboxdQEMU(t *testing.T) {
	g := guesttest.Require(t)
	mnt := xfstest.Mount(t, 4<<30)
	killQEMUsOnCleanup(t, mnt)
	bin := buildSandboxd(t)
	data := filepath.Join(mnt, "data")
	cfg := map[string]any{
		"listen":     "127.0.0.1:0",
		"data_dir":   data,
		"node_id":    "e2e",
		"api_token":  "root",
		"hypervisor": "qemu",
		"qemu":       map[string]any{"accel": "tcg", "kernel": g.Kernel, "initrd": g.Initrd},
		"pools":      []map[string]any{{"template": "default", "net": "none", "size": "small", "warm": 1}},
		"nats":       map[string]any{"disabled": true},
	}
	cfgPath := filepath.Join(t.TempDir(), "sandboxd.json")
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	t.Cleanup(cancel)
	e := &e2e{t: t, base: ctx, bin: bin, cfg: cfgPath, data: data, log: filepath.Join(t.TempDir(), "sandboxd.log")}
	t.Cleanup(e.dumpLogOnFailure)
	e.start()
	t.Cleanup(func() { e.t = t; e.stop() })
	info, err := e.api.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Hypervisor != "qemu" {
		t.Fatalf("/v1/info hypervisor %q, want qemu", info.Hypervisor)
	}

	t.Run("hibernate and wake", func(t *testing.T) {
		e.t = t
		c := e.claim()
		runDir := e.runDir(c.VM)
		sum := guestDo(t, e.ctx(), runDir, func(a *agent.Client) (string, error) { return a.Write(e.ctx(), 8<<20) })
		before := e.uptime(runDir)
		for gen := 1; gen <= 3; gen++ {
			e.hibernated(c, runDir)
			e.wake(c, runDir)
			before = e.sameGuest(runDir, sum, before, fmt.Sprintf("generation %d", gen))
		}
		e.guestIdentity(c, runDir)
		e.release(c, runDir)
	})
	if t.Failed() {
		return
	}

	t.Run("daemon killed mid-hibernate", func(t *testing.T) {
		e.t = t
		c := e.claim()
		runDir := e.runDir(c.VM)
		sum := guestDo(t, e.ctx(), runDir, func(a *agent.Client) (string, error) { return a.Write(e.ctx(), 8<<20) })
		before := e.uptime(runDir)
		hib := filepath.Join(data, "store", "hibernate")
		for _, when := range []string{"right after the request", "when the temp dir appears"} {
			// Answered once durable, not once done: the kill lands mid-hibernate.
			_, err := e.api.HibernateNoWait(e.ctx(), c.ID)
			e.check(err)
			if when == "when the temp dir appears" {
				if !eventually(30*time.Second, 100*time.Microsecond, func() bool {
					return len(tempDirs(t, hib)) != 0 || len(e.snapshots(c.VM)) != 0
				}) {
					t.Fatal("no temp dir and no snapshot appeared in the store within 30 s of the hibernate request")
				}
			}
			e.kill()
			t.Logf("killed %s: temp dirs %v, snapshots %v, QEMU %v", when, tempDirs(t, hib), e.snapshots(c.VM), qemuPIDs(runDir))
			e.start()
			e.reconciled()
			switch st := e.waitState(c.ID, "hibernated", "running"); st {
			case "hibernated":
				t.Logf("%s: the claim came back hibernated", when)
				e.checkHibernated(c, runDir)
				e.wake(c, runDir)
			case "running":
				// The hibernate failed and was rolled back; the VM must still
				// be whole, and hibernate and wake as usual.
				t.Logf("%s: the claim came back running", when)
				before = e.sameGuest(runDir, sum, before, when+", rolled back")
				e.hibernated(c, runDir)
				e.wake(c, runDir)
			}
			before = e.sameGuest(runDir, sum, before, when)
		}
		// Killed as the wake's QEMU appears: the restart re-runs the wake,
		// which adopts that QEMU if it runs or else stops it and starts over.
		e.hibernated(c, runDir)
		_, err := e.api.WakeNoWait(e.ctx(), c.ID)
		e.check(err)
		if !eventually(30*time.Second, 100*time.Microsecond, func() bool { return len(qemuPIDs(runDir)) != 0 }) {
			t.Fatal("no QEMU appeared within 30 s of the wake request")
		}
		e.kill()
		t.Logf("killed as the wake's QEMU appeared: QEMU %v, files %v", qemuPIDs(runDir), dirNames(runDir))
		e.start()
		e.reconciled()
		e.waitState(c.ID, "running")
		e.woken(c, runDir)
		before = e.sameGuest(runDir, sum, before, "killed mid-wake")
		// Killed as soon as a waiting wake answered: the snapshot's removal
		// after the wake may not have run; the start-up reconcile sweeps it.
		e.hibernated(c, runDir)
		e.check(e.api.Wake(e.ctx(), c.ID))
		e.kill()
		e.start()
		e.reconciled()
		e.waitState(c.ID, "running")
		e.woken(c, runDir)
		e.sameGuest(runDir, sum, before, "killed right after the wake")
		e.release(c, runDir)
	})

	// Issue 24: promote a sandbox and claim from its new pool key (a clone
	// of the promoted golden has the source's files); delete the template,
	// and its golden is collected from the store.
	t.Run("promote and delete the template", func(t *testing.T) {
		e.t = t
		c := e.claim()
		runDir := e.runDir(c.VM)
		sum := guestDo(t, e.ctx(), runDir, func(a *agent.Client) (string, error) { return a.Write(e.ctx(), 8<<20) })
		pr, err := e.api.Promote(e.ctx(), c.ID, c.Token, "promoted")
		e.check(err)
		if pr.Key != (api.TemplateKey{Template: "promoted", Net: "none", Size: "small"}) || !strings.HasPrefix(pr.ContentDigest, "sha256:") {
			t.Fatalf("promote answer %+v", pr)
		}
		if got := guestDo(t, e.ctx(), runDir, func(a *agent.Client) (string, error) { return a.Sha(e.ctx()) }); got != sum {
			t.Fatalf("the promoted sandbox's data after the promote: %s, want %s", got, sum)
		}
		tc, err := e.api.Claim(e.ctx(), api.ClaimRequest{Template: "promoted", TTLSeconds: 3600})
		e.check(err)
		if tc.Tier != "clone" {
			t.Fatalf("claim of the template: %+v, want a clone", tc)
		}
		tr := e.runDir(tc.VM)
		if got := guestDo(t, e.ctx(), tr, func(a *agent.Client) (string, error) { return a.Sha(e.ctx()) }); got != sum {
			t.Fatalf("the template's clone has %s, want the source's %s", got, sum)
		}
		e.release(tc, tr)
		e.release(c, runDir)
		e.check(e.api.DeleteTemplate(e.ctx(), pr.Key, pr.ContentDigest))
		goldens := filepath.Join(data, "store", "golden")
		if !eventually(60*time.Second, 20*time.Millisecond, func() bool {
			st, err := e.api.Store(e.ctx())
			e.check(err)
			ents, _ := os.ReadDir(goldens)
			return len(st.Snapshots) == 1 && len(ents) == 1 && filepath.Join("golden", ents[0].Name()) == st.Snapshots[0].Dir
		}) {
			t.Fatalf("the template's golden was not collected: %v", dirNames(goldens))
		}
	})
	if t.Failed() {
		return
	}

	// Issue 24: sandboxd killed right after each step of a checkpoint of a
	// running sandbox (SBX_CRASH_AT=checkpoint:<step>; QEMU's steps are
	// timed at their end): after the restart the checkpoint is done once
	// (listed, in the store once, no temp dir), the guest runs (not left
	// stopped) with its data, and the checkpoint is claimable.
	t.Run("crash at each checkpoint step", func(t *testing.T) {
		e.t = t
		c := e.claim()
		runDir := e.runDir(c.VM)
		sum := guestDo(t, e.ctx(), runDir, func(a *agent.Client) (string, error) { return a.Write(e.ctx(), 1<<20) })
		for _, step := range []string{StepStop, StepMigrate, StepClone, StepCont, StepMeta, StepSync, StepRename} {
			e.stop()
			e.start("SBX_CRASH_AT=checkpoint:" + step)
			if _, err := e.api.Checkpoint(e.ctx(), c.ID, api.CheckpointRequest{}); err == nil {
				t.Fatalf("checkpoint with a crash armed at %s answered", step)
			}
			select {
			case <-e.exited:
			case <-time.After(time.Minute):
				t.Fatalf("sandboxd did not crash at checkpoint:%s", step)
			}
			e.start()
			var mine []api.CheckpointRecord
			if !eventually(2*time.Minute, 50*time.Millisecond, func() bool {
				all, err := e.api.Checkpoints(e.ctx())
				e.check(err)
				mine = mine[:0]
				for _, ck := range all {
					if ck.SandboxID == c.ID {
						mine = append(mine, ck)
					}
				}
				return len(mine) == 1
			}) {
				t.Fatalf("crash at %s: checkpoints of the sandbox %v, want one", step, mine)
			}
			if st := e.waitState(c.ID, "running"); st != "running" {
				t.Fatalf("crash at %s: sandbox %s", step, st)
			}
			if got := guestDo(t, e.ctx(), runDir, func(a *agent.Client) (string, error) { return a.Sha(e.ctx()) }); got != sum {
				t.Fatalf("crash at %s: the guest's data %s, want %s", step, got, sum)
			}
			if dirs, _ := filepath.Glob(filepath.Join(e.data, "store", "checkpoint", mine[0].ID)); len(dirs) != 1 {
				t.Fatalf("crash at %s: checkpoint dir %v", step, dirs)
			}
			if temps, _ := filepath.Glob(filepath.Join(e.data, "store", ".sbx-tmp-*")); len(temps) != 0 {
				t.Fatalf("crash at %s: temp dirs left %v", step, temps)
			}
			e.check(e.api.DeleteCheckpoint(e.ctx(), mine[0].ID))
		}
		// The last one claimed before its delete settles is not needed:
		// a claim from a fresh checkpoint shows it claimable.
		ck, err := e.api.Checkpoint(e.ctx(), c.ID, api.CheckpointRequest{})
		e.check(err)
		b, err := e.api.ClaimCheckpoint(e.ctx(), ck.ID, api.CheckpointClaimRequest{TTLSeconds: 600})
		e.check(err)
		br := e.runDir(b.VM)
		if got := guestDo(t, e.ctx(), br, func(a *agent.Client) (string, error) { return a.Sha(e.ctx()) }); got != sum {
			t.Fatalf("the checkpoint's clone has %s, want %s", got, sum)
		}
		e.release(b, br)
		e.release(c, runDir)
	})
	e.t = t
	e.stop()
}

// e2e drives one sandboxd data dir through daemon restarts.
type e2e struct {
	t        *testing.T
	base     context.Context // the whole test's deadline
	bin, cfg string
	data     string
	log      string

	cmd     *exec.Cmd
	exited  chan struct{}
	api     *apiclient.Client
	logSeen int64 // log offset where the current daemon's output starts
}

func (e *e2e) ctx() context.Context { return e.base }

// start runs sandboxd and waits until it serves.
func (e *e2e) start(env ...string) {
	t := e.t
	t.Helper()
	f, err := os.OpenFile(e.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	e.logSeen = st.Size()
	cmd := exec.Command(e.bin, "-config", e.cfg)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(append(os.Environ(), "SBX_API_TOKEN=root"), env...)
	err = cmd.Start()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	e.cmd, e.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) { _ = cmd.Wait(); close(exited) }(e.exited)
	deadline := time.Now().Add(time.Minute)
	for {
		if addr := e.serving(); addr != "" {
			if e.api, err = apiclient.New(addr, "root", nil); err != nil {
				t.Fatal(err)
			}
			return
		}
		select {
		case <-e.exited:
			t.Fatalf("sandboxd exited during start-up: %v", cmd.ProcessState)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("sandboxd did not serve within a minute")
		}
	}
}

// logLine is the part of the daemon's JSON log lines the test reads.
type logLine struct {
	Message string `json:"message"`
	RunDir  string `json:"run_dir"`
	// ClockOff is how far a guest's clock was off when the driver set it.
	ClockOff string `json:"guest_clock_was_off"`
	Listen   string `json:"listen"`
	Adopted  int    `json:"adopted"`
	Exited   int    `json:"exited"`
	Orphans  int    `json:"orphans_killed"`
	Removed  int    `json:"removed"`
}

// findLog returns the first line of the current daemon's log with message msg.
func (e *e2e) findLog(msg string) (logLine, bool) {
	lines := e.findLogs(msg, 1)
	if len(lines) == 0 {
		return logLine{}, false
	}
	return lines[0], true
}

// findLogs returns the current daemon's log lines with message msg, at
// most limit of them (0: all).
func (e *e2e) findLogs(msg string, limit int) []logLine {
	f, err := os.Open(e.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(e.logSeen, io.SeekStart); err != nil {
		return nil
	}
	var out []logLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line logLine
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == msg {
			out = append(out, line)
			if len(out) == limit {
				break
			}
		}
	}
	return out
}

// guestIdentity checks what a user of a woken sandbox sees of its machine
// (issue 25): the guest's wall clock is the host's (the driver set it on
// the wake, and logged how far off it was: the offset a guest kept
// without the sync), its hostname is set, and the memory the API reports
// is what QEMU gave it (small is 512 MiB, halved under TCG).
func (e *e2e) guestIdentity(c *api.ClaimResponse, runDir string) {
	e.t.Helper()
	for _, l := range e.findLogs("qemu: guest clock set", 0) {
		if l.RunDir == runDir {
			e.t.Logf("guest clock when the driver set it (boot, clone or wake): %s off", l.ClockOff)
		}
	}
	hostBefore := time.Now()
	guest := guestDo(e.t, e.ctx(), runDir, func(a *agent.Client) (time.Time, error) { return a.Clock(e.ctx()) })
	hostAfter := time.Now()
	// The guest read its clock between the two host reads; a second either
	// way is the serial line's latency and TCG's scheduling, far below the
	// minutes a snapshot's clock lags.
	off := guest.Sub(hostBefore)
	if guest.Before(hostBefore.Add(-time.Second)) || guest.After(hostAfter.Add(time.Second)) {
		e.t.Errorf("guest clock %v after the wake, host %v..%v: %v off", guest, hostBefore, hostAfter, off)
	}
	e.t.Logf("guest clock after the wake: %v off the host's (read window %v)", off.Round(time.Millisecond), hostAfter.Sub(hostBefore).Round(time.Millisecond))

	guestAPI := e.api.WithToken(c.Token) // the data plane takes the sandbox's own token
	r, err := guestAPI.Exec(e.ctx(), c.ID, api.ExecRequest{Argv: []string{"hostname"}})
	if err != nil {
		e.t.Fatal(err)
	}
	if r.ExitCode != 0 || r.Stdout != "sandbox\n" {
		e.t.Errorf("hostname in the guest: exit %d, %q (stderr %q); want sandbox", r.ExitCode, r.Stdout, r.Stderr)
	}

	sb, err := e.api.Sandbox(e.ctx(), c.ID)
	if err != nil {
		e.t.Fatal(err)
	}
	if sb.MemTotalBytes != 256<<20 || sb.CPUCount != 1 {
		e.t.Errorf("the sandbox reports %d bytes and %d vCPUs; its small VM got 256 MiB and 1 vCPU under TCG", sb.MemTotalBytes, sb.CPUCount)
	}
	// The guest's own MemTotal is the VM's memory less what the kernel
	// keeps: below what is reported, and well above half of it.
	r, err = guestAPI.Exec(e.ctx(), c.ID, api.ExecRequest{Argv: []string{"sed", "-n", "s/^MemTotal: *\\([0-9]*\\) kB$/\\1/p", "/proc/meminfo"}})
	if err != nil {
		e.t.Fatal(err)
	}
	kb, err := strconv.ParseInt(strings.TrimSpace(r.Stdout), 10, 64)
	if err != nil || kb<<10 > sb.MemTotalBytes || kb<<10 < sb.MemTotalBytes/2 {
		e.t.Errorf("guest MemTotal %q kB (%v) against the reported %d bytes", r.Stdout, err, sb.MemTotalBytes)
	}
	e.t.Logf("guest MemTotal %d kB; reported mem_total_bytes %d", kb, sb.MemTotalBytes)
}

// serving returns the listen address from the current daemon's "sandboxd
// serving" log line, or "".
func (e *e2e) serving() string {
	line, _ := e.findLog("sandboxd serving")
	return line.Listen
}

// reconciled checks the restarted daemon's start-up reconcile: it adopted at
// least the pool's warm VM and found no VM dead.
func (e *e2e) reconciled() {
	e.t.Helper()
	line, ok := e.findLog("start-up reconcile done")
	if !ok || line.Adopted < 1 || line.Exited != 0 {
		e.t.Fatalf("start-up reconcile: %+v (found %v); want the warm VM adopted and no VM dead", line, ok)
	}
	e.t.Logf("start-up reconcile: adopted %d, exited %d, removed %d", line.Adopted, line.Exited, line.Removed)
}

// kill SIGKILLs the daemon (its QEMUs, in their own process groups, live on).
func (e *e2e) kill() {
	if err := e.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	<-e.exited
}

// stop ends the daemon with SIGTERM (idempotent) and checks it exited
// cleanly and, under -race, without a data race report.
func (e *e2e) stop() {
	if e.cmd == nil {
		return
	}
	select {
	case <-e.exited:
		return
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(30 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
		e.t.Error("sandboxd ignored SIGTERM for 30 s")
	}
	if code := e.cmd.ProcessState.ExitCode(); code != 0 {
		e.t.Errorf("sandboxd exited with %d after SIGTERM", code)
	}
	if b, err := os.ReadFile(e.log); err == nil && bytes.Contains(b, []byte("WARNING: DATA RACE")) {
		e.t.Error("sandboxd reported a data race (see its log)")
	}
}

func (e *e2e) dumpLogOnFailure() {
	if !e.t.Failed() {
		return
	}
	b, err := os.ReadFile(e.log)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	e.t.Logf("sandboxd log (tail):\n%s", strings.Join(lines, "\n"))
}

// check fails the test on an API error.
func (e *e2e) check(err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
}

// claim waits for a warm VM and claims it.
func (e *e2e) claim() *api.ClaimResponse {
	e.t.Helper()
	var info *api.Info
	if !eventually(2*time.Minute, 50*time.Millisecond, func() bool {
		var err error
		info, err = e.api.Info(e.ctx())
		e.check(err)
		return len(info.Pools) == 1 && info.Pools[0].Warm >= 1
	}) {
		e.t.Fatalf("no warm VM within 2 minutes: %+v", info)
	}
	c, err := e.api.Claim(e.ctx(), api.ClaimRequest{Template: "default", TTLSeconds: 3600})
	e.check(err)
	if c.Tier != "warm" || c.VM == "" {
		e.t.Fatalf("claim %+v, want a warm VM", c)
	}
	return c
}

// runDir finds the VM's run dir: <data>/run/<instance>/<vm>.
func (e *e2e) runDir(vm string) string {
	e.t.Helper()
	m, err := filepath.Glob(filepath.Join(e.data, "run", "*", vm))
	if err != nil || len(m) != 1 {
		e.t.Fatalf("run dir of %s: %v, %v", vm, m, err)
	}
	return m[0]
}

// dirNames lists the names in dir (for logs).
func dirNames(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// snapshots lists the VM's hibernate snapshots in the store.
func (e *e2e) snapshots(vm string) []string {
	m, _ := filepath.Glob(filepath.Join(e.data, "store", "hibernate", vm+"-*"))
	return m
}

// waitState polls the sandbox until its state is one of want and returns it.
func (e *e2e) waitState(id string, want ...string) string {
	e.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		sb, err := e.api.Sandbox(e.ctx(), id)
		e.check(err)
		for _, w := range want {
			if sb.State == w {
				return w
			}
		}
		switch sb.State {
		case "failed", "released", "expired":
			e.t.Fatalf("sandbox %s is %s (%s), want %v", id, sb.State, sb.Reason, want)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("sandbox %s still %s after 90 s, want %v", id, sb.State, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hibernated hibernates the claim and checks the result.
func (e *e2e) hibernated(c *api.ClaimResponse, runDir string) {
	e.t.Helper()
	e.check(e.api.Hibernate(e.ctx(), c.ID))
	e.waitState(c.ID, "hibernated")
	e.checkHibernated(c, runDir)
}

// checkHibernated: no QEMU and no run dir; one complete snapshot of the VM in
// the store and no temp dir.
func (e *e2e) checkHibernated(c *api.ClaimResponse, runDir string) {
	e.t.Helper()
	if pids := qemuPIDs(runDir); len(pids) != 0 {
		e.t.Fatalf("hibernated, but QEMU %v still runs for %s", pids, runDir)
	}
	noEntry(e.t, runDir)
	snaps := e.snapshots(c.VM)
	if len(snaps) != 1 {
		e.t.Fatalf("hibernated, with snapshots %v in the store", snaps)
	}
	if m, err := checkSnapshot(snaps[0]); err != nil || m.MemoryMiB != 256 {
		e.t.Fatalf("snapshot %s: %+v, %v", snaps[0], m, err)
	}
	if tmp := tempDirs(e.t, filepath.Dir(snaps[0])); len(tmp) != 0 {
		e.t.Fatalf("temp dirs left in the store: %v", tmp)
	}
}

// wake wakes the claim and checks the woken VM.
func (e *e2e) wake(c *api.ClaimResponse, runDir string) {
	e.t.Helper()
	e.check(e.api.Wake(e.ctx(), c.ID))
	e.waitState(c.ID, "running")
	e.woken(c, runDir)
}

// woken checks a woken VM: one QEMU, and its snapshot dropped (soon: after the
// wake is durable).
func (e *e2e) woken(c *api.ClaimResponse, runDir string) {
	e.t.Helper()
	if len(qemuPIDs(runDir)) != 1 {
		e.t.Fatalf("woken, with QEMU processes %v for %s", qemuPIDs(runDir), runDir)
	}
	if !eventually(30*time.Second, 20*time.Millisecond, func() bool { return len(e.snapshots(c.VM)) == 0 }) {
		e.t.Fatalf("snapshots %v not dropped 30 s after the wake", e.snapshots(c.VM))
	}
}

func (e *e2e) uptime(runDir string) agent.Uptime {
	e.t.Helper()
	return guestDo(e.t, e.ctx(), runDir, func(a *agent.Client) (agent.Uptime, error) { return a.Uptime(e.ctx()) })
}

// sameGuest checks the guest kept its data and its boot, and that its counter
// went on from where it stopped; it returns the new uptime.
func (e *e2e) sameGuest(runDir, sum string, before agent.Uptime, what string) agent.Uptime {
	e.t.Helper()
	if got := guestDo(e.t, e.ctx(), runDir, func(a *agent.Client) (string, error) { return a.Sha(e.ctx()) }); got != sum {
		e.t.Fatalf("%s: sha256 %s, want %s", what, got, sum)
	}
	after := e.uptime(runDir)
	if after.BootID != before.BootID {
		e.t.Fatalf("%s: the guest rebooted (boot id %s, was %s)", what, after.BootID, before.BootID)
	}
	// The counter only runs with the guest: it went on, and by no more than
	// the guest's own uptime allows (it did not run while hibernated).
	dc, du := after.Counter-before.Counter, after.Since-before.Since
	if after.Counter < before.Counter || du < 0 || time.Duration(dc)*agent.Tick > du+2*agent.Tick {
		e.t.Fatalf("%s: counter %d -> %d over guest uptime %v -> %v", what, before.Counter, after.Counter, before.Since, after.Since)
	}
	e.t.Logf("%s: sha256 kept, counter %d -> %d", what, before.Counter, after.Counter)
	return after
}

// release releases the claim and waits for the destroy: no QEMU, no run dir.
func (e *e2e) release(c *api.ClaimResponse, runDir string) {
	e.t.Helper()
	e.check(e.api.Release(e.ctx(), c.ID))
	e.waitState(c.ID, "released")
	if !eventually(30*time.Second, 20*time.Millisecond, func() bool {
		_, err := os.Lstat(runDir)
		return len(qemuPIDs(runDir)) == 0 && errors.Is(err, os.ErrNotExist)
	}) {
		e.t.Fatalf("30 s after the release: QEMU %v, run dir entries %v", qemuPIDs(runDir), dirNames(runDir))
	}
	if snaps := e.snapshots(c.VM); len(snaps) != 0 {
		e.t.Fatalf("released VM's snapshots left: %v", snaps)
	}
}

// buildSandboxd builds cmd/sandboxd (with -race when this test runs with it).
func buildSandboxd(t *testing.T) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatal("no go toolchain to build sandboxd")
		}
	}
	out := filepath.Join(t.TempDir(), "sandboxd")
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goBin, append(args, "./cmd/sandboxd")...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build sandboxd: %v\n%s", err, b)
	}
	return out
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}
