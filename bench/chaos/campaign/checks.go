package campaign

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// finalChecks kills the daemon once more, restarts it without faults, waits
// until nothing is in flight and runs every check.
func (c *campaign) finalChecks(ctx context.Context) {
	c.closeWindow()
	if c.a.Running() {
		if err := c.signalKill(); err != nil {
			c.violate("final kill: %v", err)
			return
		}
	}
	c.mu.Lock()
	c.armed = ""
	c.mu.Unlock()
	if err := c.restart(ctx, false); err != nil {
		c.violate("daemon did not come back for the final checks: %v", err)
		return
	}
	cl := c.a.Client(30 * time.Second)
	if err := c.quiesce(ctx, cl); err != nil {
		c.violate("not quiescent 3 minutes after the workload stopped: %v", err)
	}
	c.checkLocks(ctx, "final (quiescent)")
	c.probeRound(ctx, "final (quiescent)")
	// Snapshots recorded but not yet compared (a wake whose outcome the
	// workload did not see) are compared now.
	c.mu.Lock()
	var pending []*claim
	for _, x := range c.claims {
		if x.verifyWake {
			pending = append(pending, x)
		}
	}
	c.mu.Unlock()
	for _, x := range pending {
		if sb, err := cl.Sandbox(ctx, x.id); err == nil && sb.State == "running" {
			c.verifyWoken(ctx, x)
		}
	}
	log, err := readLog(ctx, cl)
	if err != nil {
		c.violate("read the op log over /v1/events: %v", err)
		return
	}
	c.checkClaims(ctx, cl, log)
	c.checkPools(ctx, cl)
	vms := c.checkVMs(ctx, cl)
	c.checkOrphans(vms)
	c.checkOthers(ctx)
	c.checkUsage(ctx, log)
	c.checkStoreRecipes(ctx, cl, log)
}

// quiesce waits until no claim is pending, hibernating or waking, no VM has
// a side effect in flight and no refill runs.
func (c *campaign) quiesce(ctx context.Context, cl *apiclient.Client) error {
	var last string
	err := waitFor(ctx, 3*time.Minute, func() bool {
		in, err := cl.Info(ctx)
		if err != nil {
			last = err.Error()
			return false
		}
		if in.Pending > 0 {
			last = fmt.Sprintf("%d pending claims", in.Pending)
			return false
		}
		for _, p := range in.Pools {
			if p.Refilling > 0 || p.GoldenState == "building" {
				last = fmt.Sprintf("pool %s refilling %d, golden %s", p.Key, p.Refilling, p.GoldenState)
				return false
			}
		}
		vms, err := vmView(ctx, cl)
		if err != nil {
			last = err.Error()
			return false
		}
		for _, v := range vms {
			switch v.State {
			case "cloning", "hibernating", "waking", "destroying", "restarting", "checkpointing", "promoting", "archiving", "unarchiving":
				last = fmt.Sprintf("VM %s is %s", v.Name, v.State)
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("%w (last: %s)", err, last)
	}
	return nil
}

// logEvent is one op-log event as /v1/events sends it.
type logEvent = api.EventJSON

// readLog reads the whole op log over /v1/events.
func readLog(ctx context.Context, cl *apiclient.Client) ([]logEvent, error) {
	in, err := cl.Info(ctx)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := cl.Events(sctx, apiclient.EventsOptions{From: 1})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []logEvent
	for uint64(len(out)) < in.LogSeq {
		ev, err := s.Next()
		if err != nil {
			return out, fmt.Errorf("after %d of %d events: %w", len(out), in.LogSeq, err)
		}
		if _, ok := ev.Seq(); !ok {
			continue
		}
		le, err := ev.LogEvent()
		if err != nil {
			return out, err
		}
		out = append(out, le)
	}
	return out, nil
}

// vmView reads the first sync of the ?view=vms stream.
func vmView(ctx context.Context, cl *apiclient.Client) ([]api.VM, error) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := cl.Events(sctx, apiclient.EventsOptions{View: "vms"})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil {
			return nil, err
		}
		if ev.Event == "sync" {
			var body struct {
				VMs []api.VM `json:"vms"`
			}
			err := json.Unmarshal(ev.Data, &body)
			return body.VMs, err
		}
	}
}

// exposure says, per VM, whether a VMM of it ran with chsim faults: one
// started (clone, wake, restart) while an incarnation with faults ran. Its
// request and result events bound when the VMM started.
func (c *campaign) exposure(log []logEvent) map[string]bool {
	c.mu.Lock()
	windows := append([]window(nil), c.faultWindows...)
	c.mu.Unlock()
	start := map[string]time.Time{} // VM -> time its current launch was requested
	out := map[string]bool{}
	faulty := func(a, b time.Time) bool {
		for _, w := range windows {
			if w.overlaps(a, b) {
				return true
			}
		}
		return false
	}
	for _, ev := range log {
		t, _ := time.Parse(time.RFC3339Nano, ev.Time)
		var p struct {
			VM string `json:"vm"`
		}
		_ = json.Unmarshal(ev.Payload, &p)
		switch ev.Type {
		case "vm_clone_requested", "wake_requested", "vm_restart_requested", "hibernate_requested":
			start[p.VM] = t
		case "vm_cloned", "woken", "vm_restarted", "vm_clone_failed", "wake_failed", "vm_restart_failed", "hibernated", "hibernate_failed":
			if faulty(start[p.VM], t) {
				out[p.VM] = true
			}
		}
	}
	return out
}

// checkClaims: every acked operation is reflected in the claims' state.
func (c *campaign) checkClaims(ctx context.Context, cl *apiclient.Client, log []logEvent) {
	exposed := c.exposure(log)
	archived := archivedClaims(log)
	failures := map[string]string{}
	for _, ev := range log {
		if ev.Type == "claim_failed" {
			var p struct{ Reason, Error string }
			_ = json.Unmarshal(ev.Payload, &p)
			failures[ev.Aggregate.ID] = p.Reason + ": " + p.Error
		}
	}
	c.mu.Lock()
	claims := make([]*claim, 0, len(c.order))
	for _, id := range c.order {
		claims = append(claims, c.claims[id])
	}
	c.mu.Unlock()
	acked, explained := 0, 0
	for _, x := range claims {
		if !x.acked {
			continue
		}
		acked++
		sb, err := cl.Sandbox(ctx, x.id)
		if err != nil {
			c.violate("acked claim %s: %v (lost)", x.id, err)
			continue
		}
		if sb.VM != x.vm {
			c.violate("acked claim %s: VM %s, it was served by %s", x.id, sb.VM, x.vm)
		}
		want := expectedStates(x)
		ok := want[sb.State]
		if !ok && (exposed[x.vm] || len(x.vmmKills) > 0) {
			// Faults or VMM kills explain a failed hibernate (still
			// running), a failed wake (still hibernated) and a lost VM.
			if sb.State == "running" || sb.State == "hibernated" || sb.State == "failed" {
				ok = true
				explained++
			}
		}
		if !ok {
			c.violate("acked claim %s: state %s (%s), its acknowledged operations ask for %s (ops %v, VMM kills %d, faulty VMM %v)",
				x.id, sb.State, failures[x.id], joinKeys(want), x.ops, len(x.vmmKills), exposed[x.vm])
		}
		if sb.State != "released" && sb.State != "failed" && !x.renewUnknown && !archived[x.id] && !slices.Contains(x.deadlines, sb.Deadline) {
			c.violate("acked claim %s: deadline %s, acknowledged %s", x.id, sb.Deadline, strings.Join(x.deadlines, " or "))
		}
	}
	c.checked("acked claims checked", acked)
	c.checked("claims archived at least once (deadline set by the archive)", len(archived))
	c.checkStoredSnapshots(ctx, cl, claims)
	c.checked("claims whose state faults or VMM kills explain", explained)
	live, err := cl.Sandboxes(ctx, apiclient.ListOptions{})
	if err != nil {
		c.violate("list sandboxes: %v", err)
		return
	}
	seen := map[string]string{}
	for _, sb := range live {
		if other, dup := seen[sb.VM]; dup && sb.VM != "" {
			c.violate("VM %s serves claims %s and %s", sb.VM, other, sb.ID)
		}
		seen[sb.VM] = sb.ID
	}
	c.checked("live claims checked for a shared VM", len(live))
}

// checkStoredSnapshots: the snapshot of every claim still hibernated is the
// one recorded at its hibernate, unchanged through every kill since.
func (c *campaign) checkStoredSnapshots(ctx context.Context, cl *apiclient.Client, claims []*claim) {
	n := 0
	for _, x := range claims {
		c.mu.Lock()
		snap := x.snap
		c.mu.Unlock()
		if snap == nil {
			continue
		}
		if sb, err := cl.Sandbox(ctx, x.id); err != nil || sb.State != "hibernated" {
			continue
		}
		dir, err := latestSnapshot(filepath.Join(c.a.DataDir, "store"), x.vm)
		if err != nil && len(c.archivesOf(x.vm)) > 0 {
			// Archived since it was read (checkArchives compares).
			continue
		}
		if err != nil {
			c.violate("hibernated claim %s: %v", x.id, err)
			continue
		}
		s, err := sumsOf(dir, filepath.Join(dir, diskFile))
		if err != nil || s != *snap {
			c.violate("hibernated claim %s: snapshot %s changed since its hibernate (%v)", x.id, dir, err)
		}
		n++
	}
	c.checked("hibernated claims' snapshots intact", n)
}

// checkPools: the configuration is the last acked PUT (or a later one whose
// outcome is unknown).
func (c *campaign) checkPools(ctx context.Context, cl *apiclient.Client) {
	got, err := cl.Pools(ctx)
	if err != nil {
		c.violate("GET /v1/pools: %v", err)
		return
	}
	c.mu.Lock()
	hist := append([]poolsPut(nil), c.pools.hist...)
	c.mu.Unlock()
	last := -1
	for i, h := range hist {
		if h.outcome == outAcked {
			last = i
		}
	}
	key := func(ps []PoolConf) string {
		var s []string
		for _, p := range ps {
			s = append(s, fmt.Sprintf("%s/%s/%s:%d:%d", p.Template, p.Net, p.Size, p.Warm, max(p.WarmMax, p.Warm)))
		}
		sort.Strings(s)
		return strings.Join(s, ",")
	}
	var have []PoolConf
	for _, p := range got.Pools {
		have = append(have, PoolConf{Template: p.Template, Net: p.Net, Size: p.Size, Warm: p.Warm, WarmMax: p.WarmMax})
	}
	allowed := map[string]bool{}
	for i := max(last, 0); i < len(hist); i++ {
		if i == last || hist[i].outcome == outUnknown {
			allowed[key(hist[i].pools)] = true
		}
	}
	if !allowed[key(have)] {
		c.violate("pools are %s, the acknowledged configuration is %s", key(have), joinKeys(allowed))
	}
	c.checked("pool configurations acked", countAcked(hist))
}

func countAcked(h []poolsPut) int {
	n := 0
	for _, x := range h {
		if x.outcome == outAcked {
			n++
		}
	}
	return n
}

// checkVMs: every VM the state says runs has a VMM that answers, and
// returns the VM view.
func (c *campaign) checkVMs(ctx context.Context, cl *apiclient.Client) []api.VM {
	vms, err := vmView(ctx, cl)
	if err != nil {
		c.violate("VM view: %v", err)
		return nil
	}
	n := 0
	for _, v := range vms {
		if v.State != "warm" && v.State != "claimed" {
			continue
		}
		n++
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := ch.New(filepath.Join(c.a.DataDir, "run", v.RunDir, "api.sock")).Info(pctx)
		cancel()
		if err != nil || info.State != ch.StateRunning {
			c.violate("VM %s is %s in state but its VMM does not run it (%v)", v.Name, v.State, err)
		}
	}
	c.checked("running VMs answered their VMM", n)
	return vms
}

// checkOrphans: no VMM and no run dir under the data dir that the state
// does not account for (the planted foreign one aside).
func (c *campaign) checkOrphans(vms []api.VM) {
	live := map[string]bool{}
	for _, v := range vms {
		if v.Live {
			live[v.RunDir] = true
		}
	}
	runRoot := filepath.Join(c.a.DataDir, "run")
	procs := VMMsUnder(c.a.DataDir)
	for _, p := range procs {
		if p.Pid == c.foreign.Pid {
			continue
		}
		rel, _ := filepath.Rel(runRoot, filepath.Dir(p.Socket))
		if !live[rel] {
			c.violate("orphan VMM pid %d serving %s: the state has no live VM there", p.Pid, rel)
		}
	}
	c.checked("VMM processes under the data dir", len(procs))
	inst := c.instance()
	ents, _ := os.ReadDir(filepath.Join(runRoot, inst))
	for _, e := range ents {
		if !live[inst+"/"+e.Name()] {
			c.violate("run dir %s/%s left behind: the state has no live VM there", inst, e.Name())
		}
	}
	c.checked("run dirs of the instance", len(ents))
	// Snapshots: one per hibernated VM, none of VMs that run or are gone.
	hib := map[string]bool{}
	for _, v := range vms {
		if v.State == "hibernated" {
			hib[v.Name] = true
		}
	}
	snaps, _ := filepath.Glob(filepath.Join(c.a.DataDir, "store", "hibernate", "*"))
	per := map[string]int{}
	for _, dir := range snaps {
		var meta struct {
			VM string `json:"vm"`
		}
		data, err := os.ReadFile(filepath.Join(dir, metaFile))
		if err == nil {
			err = json.Unmarshal(data, &meta)
		}
		if err != nil || !hib[meta.VM] {
			c.violate("snapshot %s left in the store: VM %q is not hibernated (%v)", filepath.Base(dir), meta.VM, err)
			continue
		}
		if per[meta.VM]++; per[meta.VM] > 1 {
			c.violate("VM %s has %d snapshots in the store", meta.VM, per[meta.VM])
		}
	}
	c.checked("hibernate snapshots in the store", len(snaps))
}

// checkOthers: the second instance and the planted foreign VMM were not
// touched.
func (c *campaign) checkOthers(ctx context.Context) {
	if !alive(c.foreign.Pid) {
		c.violate("the VMM of another instance id (pid %d, %s) was killed", c.foreign.Pid, c.foreignDir)
	}
	if data, err := os.ReadFile(filepath.Join(c.foreignDir, "cow.raw")); err != nil || string(data) != "another instance's disk" {
		c.violate("another instance's run dir %s was changed: %v", c.foreignDir, err)
	}
	for pid, sock := range c.bVMMs {
		if !alive(pid) {
			c.violate("a VMM of the second sandboxd (pid %d, %s) died", pid, sock)
		}
	}
	now := map[int]string{}
	for _, p := range VMMsUnder(c.b.DataDir) {
		now[p.Pid] = p.Socket
	}
	if len(now) != len(c.bVMMs) {
		c.violate("the second sandboxd's VMMs changed: %d, were %d", len(now), len(c.bVMMs))
	}
	if !c.b.Running() {
		c.violate("the second sandboxd stopped (%s)", c.b.ExitState())
		return
	}
	bc := c.b.Client(10 * time.Second)
	for _, id := range c.bClaims {
		if sb, err := bc.Sandbox(ctx, id); err != nil || sb.State != "running" {
			c.violate("the second sandboxd's claim %s: %v %v", id, sb, err)
		}
	}
	c.checked("VMMs of the second instance (unchanged)", len(c.bVMMs))
	c.checked("VMMs of another instance id in this run root", 1)
}

// usageEvents maps the op-log types the usage journal records to its record
// kinds.
var usageEvents = map[string]string{
	"claim_created": "claim", "claim_served": "serve", "hibernated": "hibernate", "woken": "wake",
	"claim_renewed": "renew", "claim_released": "release", "claim_expired": "reap", "claim_failed": "fail",
}

// checkUsage: when the daemon writes usage.jsonl, it has one record per
// usage event of the log and none twice, and one summary per ended claim.
func (c *campaign) checkUsage(ctx context.Context, log []logEvent) {
	path := filepath.Join(c.a.DataDir, "usage.jsonl")
	if _, err := os.Stat(path); err != nil {
		c.note("usage: not applicable: the daemon wrote no %s (replication %s in this run)", filepath.Base(path), map[bool]string{true: "on but no journal", false: "off"}[c.opt.NATS])
		return
	}
	want := map[string]bool{}
	ended := map[string]bool{}
	var lastSeq uint64
	for _, ev := range log {
		if kind, ok := usageEvents[ev.Type]; ok {
			want[fmt.Sprintf("%d/%s", ev.Seq, kind)] = true
			lastSeq = ev.Seq
			if kind == "release" || kind == "reap" || kind == "fail" {
				ended[ev.Aggregate.ID] = true
			}
		}
	}
	type rec struct {
		Ev  string `json:"ev"`
		ID  string `json:"id"`
		Seq uint64 `json:"seq"`
	}
	var got map[string]int
	var summaries map[string]int
	read := func() uint64 {
		got, summaries = map[string]int{}, map[string]int{}
		f, err := os.Open(path)
		if err != nil {
			return 0
		}
		defer f.Close()
		var high uint64
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r rec
			if json.Unmarshal(sc.Bytes(), &r) != nil || r.Ev == "" {
				continue
			}
			if r.Ev == "summary" {
				summaries[r.ID]++
				continue
			}
			got[fmt.Sprintf("%d/%s", r.Seq, r.Ev)]++
			high = max(high, r.Seq)
		}
		return high
	}
	if err := waitFor(ctx, time.Minute, func() bool { return read() >= lastSeq }); err != nil {
		c.violate("usage journal lags the log: last usage event %d not recorded after a minute", lastSeq)
	}
	for k := range want {
		if got[k] != 1 {
			c.violate("usage: event %s recorded %d times, want once", k, got[k])
		}
	}
	for k := range got {
		if !want[k] {
			c.violate("usage: record %s matches no event of the log", k)
		}
	}
	for id := range ended {
		if summaries[id] != 1 {
			c.violate("usage: claim %s ended, %d summaries", id, summaries[id])
		}
	}
	c.checked("usage records compared with the log", len(want))
}

// openWindow and closeWindow track the incarnations that run with faults.
func (c *campaign) openWindow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faultWindows = append(c.faultWindows, window{from: time.Now()})
}

func (c *campaign) closeWindow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.faultWindows); n > 0 && c.faultWindows[n-1].to.IsZero() {
		c.faultWindows[n-1].to = time.Now()
	}
}
