// Package restartbench measures restart-to-serving time: how long sandboxd's
// start path takes from opening the op log to the first answered HTTP
// request, with 100k live claims in the log, in two shapes:
//
//   - snapshot plus tail: the latest state snapshot (100k live claims) and a
//     tail of events after it, as a daemon that snapshots every 50k events
//     finds them;
//   - no snapshot: the same log of about 1M events replayed from the first.
//
// The start path is the daemon's, in process: node.Start, the one
// composition root (its start-up GC target included): open the log, rebuild
// (snapshot decode and tail replay), the start-up reconcile over every VM of
// the state, API, executors, loops, ready and serve, and the first GET
// /v1/info over a real loopback HTTP server. The hypervisor is an
// IN-PROCESS FAKE (nodetest.FakeDriver): its AdoptVM finds
// every VM alive at once (100k VMMs cannot run on this machine), so the
// figure is the control plane's part of a restart; the VMM side (a pid file
// read, a cmdline check and a vm.ping per VM) is measured with chsim in
// bench/execbench and the chaos campaign's restarts.
//
// The logs are built through the state machine and eventlog.Begin, as the
// engine writes them (every decision one op, fsynced in groups).
package restartbench

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// Sizes of the full run; Quick divides them by 50.
const (
	fullClaims = 100_000
	fullEvents = 1_000_000
	fullTail   = 10_000
	runs       = 5
)

var (
	keyLive = fsm.PoolKey{Template: "bench", Net: "none", Size: "small"}
	startNS = int64(1_790_000_000) * 1_000_000_000
)

// Run builds the log and measures both start shapes.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	claims, total, tail := fullClaims, fullEvents, fullTail
	if opts.Quick {
		claims, total, tail = claims/50, total/50, tail/50
	}
	dir, done, err := opts.Dir("restartbench")
	if err != nil {
		return nil, err
	}
	defer done()
	built, err := buildLog(ctx, filepath.Join(dir, "log"), claims, total, tail)
	if err != nil {
		return nil, err
	}
	sec := &report.Section{
		Name:  "restartbench",
		Title: "Restart to serving",
		Method: fmt.Sprintf("In-process sandboxd start path through node.Start (the daemon's composition root), %d runs per shape, each ended by Kill (a crash: no snapshot is added): "+
			"open the log, rebuild (engine.Rebuild, engine.New, identity and limits checked), prepare + the start-up reconcile over every VM "+
			"(hypervisor FAKED: every VM adopted at once), API + executors + loops + ready + serve, then the first GET /v1/info answered over loopback HTTP. "+
			"The log holds %d live claims (%d events in all); the snapshot shape loads the snapshot at seq %d (%.1f MiB) and replays a %d-event tail, "+
			"the other replays every event from seq 1. Log built through fsm.Decide and eventlog.Begin (one op per decision, group-committed fsyncs) in %s.",
			runs, claims, built.events, built.snapSeq, float64(built.snapBytes)/(1<<20), built.events-built.snapSeq, built.elapsed.Round(time.Millisecond)),
		Header: []string{"shape", "events replayed", "open", "rebuild", "reconcile", "api + first answer", "total p50", "total max"},
	}
	var snapTotal report.Durations
	for _, shape := range []struct {
		name       string
		noSnapshot bool
	}{{"snapshot + tail", false}, {"no snapshot (full replay)", true}} {
		var open, rebuild, rec, serve, total report.Durations
		var replayed int
		for range runs {
			runtime.GC()
			t, n, err := startOnce(ctx, dir, shape.noSnapshot, claims)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", shape.name, err)
			}
			replayed = n
			open = append(open, t.open)
			rebuild = append(rebuild, t.rebuild)
			rec = append(rec, t.reconcile)
			serve = append(serve, t.serve)
			total = append(total, t.total())
		}
		sec.AddRow(shape.name, replayed, report.Fmt(open.Quantile(0.5)), report.Fmt(rebuild.Quantile(0.5)), report.Fmt(rec.Quantile(0.5)),
			report.Fmt(serve.Quantile(0.5)), report.Fmt(total.Quantile(0.5)), report.Fmt(total.Quantile(1)))
		if !shape.noSnapshot {
			snapTotal = total
		}
	}
	p50 := snapTotal.Quantile(0.5)
	sec.Verdict(p50 < time.Second, "restart to serving with %d live claims, snapshot + tail: p50 %s (target < 1 s)", claims, report.Fmt(p50))
	sec.Notes = append(sec.Notes, "The start path is node.Start's, so it runs with sandboxd's raised start-up GC target: the state is allocated at once and collecting while it grows only re-marks what stays live.")
	sec.Notes = append(sec.Notes, "Rebuild on the daemon's path decodes the snapshot without fsm's full invariant check (fsm.DecodeOptions.SkipCheck via engine.RebuildOptions.TrustSnapshot): "+
		"the snapshot's bytes are covered by the log's CRC and its indexes are rebuilt and cross-checked; sbxctl replay keeps the full check.")
	return sec, nil
}

// logClock reads the time the log was written at, an hour after its start:
// the claims' leases are relative to it, so no timer is due and the node
// writes nothing while it is measured. Timers are the system's.
type logClock struct{ engine.Clock }

func (logClock) Now() time.Time { return time.Unix(0, startNS+int64(time.Hour)) }

type timings struct{ open, rebuild, reconcile, serve time.Duration }

func (t timings) total() time.Duration { return t.open + t.rebuild + t.reconcile + t.serve }

// startOnce starts a node (node.Start, the daemon's composition root) on
// the log in dataDir/log once, times its phases and its first answer, and
// kills it (a stop would save a snapshot and change the next run's shape).
func startOnce(ctx context.Context, dataDir string, noSnapshot bool, claims int) (timings, int, error) {
	var t timings
	// The log's own clock: the claims' leases are relative to it, so no
	// timer is due and the node writes nothing while it is measured.
	t0 := time.Now()
	n, err := node.Start(ctx, node.Config{
		DataDir: dataDir, NodeID: "bench", Listen: "127.0.0.1:0", RootToken: "root",
		RestartPolicy: fsm.DefaultRestartPolicy, ReconcileConcurrency: 8, FullReplay: noSnapshot,
		Clock: logClock{engine.SystemClock()}, Log: zerolog.Nop(),
	}, &nodetest.FakeDriver{})
	if err != nil {
		return t, 0, err
	}
	defer n.Kill()
	c, err := apiclient.New(n.URL(), "root", &http.Client{Timeout: 10 * time.Second})
	if err != nil {
		return t, 0, err
	}
	in, err := c.Info(ctx)
	if err != nil {
		return t, 0, err
	}
	wall := time.Since(t0)
	ph := map[string]time.Duration{}
	for _, p := range n.Phases {
		ph[p.Name] += p.Dur
	}
	t.open, t.rebuild, t.reconcile = ph["open"], ph["rebuild"]+ph["configure"], ph["prepare"]+ph["reconcile"]
	t.serve = wall - t.open - t.rebuild - t.reconcile
	if in.Claimed != claims {
		return t, 0, fmt.Errorf("first answer says %d claimed, want %d", in.Claimed, claims)
	}
	var live int
	n.Engine.View(func(st *fsm.State) { live = st.LiveClaims() })
	if live != claims {
		return t, 0, fmt.Errorf("rebuilt %d live claims, want %d", live, claims)
	}
	if n.Reconciled.Adopted != claims {
		return t, 0, fmt.Errorf("reconcile adopted %d VMs, want %d", n.Reconciled.Adopted, claims)
	}
	return t, n.Replayed, nil
}

// built describes the log buildLog made.
type built struct {
	events    uint64
	snapSeq   uint64
	snapBytes int
	elapsed   time.Duration
}

// writer decides commands against its own state and queues their events in
// the log (eventlog.Begin), waiting for durability in windows, as the
// engine does under load.
type writer struct {
	l       *eventlog.Log
	s       *fsm.State
	now     int64
	ops     uint64
	pending []*eventlog.Pending
}

func (w *writer) meta() fsm.Meta {
	w.ops++
	return fsm.Meta{Op: event.OpIDFromUint(uint64(w.now/1_000_000), w.ops), Now: w.now}
}

func (w *writer) do(ctx context.Context, cmd fsm.Command) ([]event.Event, error) {
	evs, err := fsm.Decide(w.s, cmd)
	if err != nil || len(evs) == 0 {
		return nil, err
	}
	p, err := w.l.Begin(evs)
	if err != nil {
		return nil, err
	}
	for i := range evs {
		if err := fsm.Apply(w.s, &evs[i]); err != nil {
			return nil, err
		}
	}
	w.pending = append(w.pending, p)
	if len(w.pending) >= 4096 {
		if err := w.flush(ctx); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

func (w *writer) flush(ctx context.Context) error {
	for _, p := range w.pending {
		if _, err := p.Wait(ctx); err != nil {
			return err
		}
	}
	w.pending = w.pending[:0]
	return nil
}

// result answers in with a success.
func (w *writer) result(ctx context.Context, in fsm.Intent) error {
	m := w.meta()
	m.Cause = in.IntentOp()
	var cmd fsm.Command
	switch in := in.(type) {
	case fsm.BuildGolden:
		cmd = fsm.GoldenBuilt{Meta: m, Key: in.Key, SnapshotDir: "golden/" + in.Key.String()}
	case fsm.CloneVM:
		cmd = fsm.VMCloned{Meta: m, VM: in.VM}
	default:
		return fmt.Errorf("unexpected intent %T", in)
	}
	_, err := w.do(ctx, cmd)
	return err
}

// buildLog writes a log with claims live claims (clone tier: claim, clone,
// served), renews up to total-tail events, a state snapshot, then tail more
// renews.
func buildLog(ctx context.Context, dir string, claims, total, tail int) (built, error) {
	start := time.Now()
	l, err := eventlog.Open(dir, eventlog.Options{NodeID: "bench", Logger: zerolog.Nop()})
	if err != nil {
		return built{}, err
	}
	defer l.Close()
	w := &writer{l: l, s: fsm.New(), now: startNS}
	step := func(cmd fsm.Command) error {
		evs, err := w.do(ctx, cmd)
		if err != nil {
			return fmt.Errorf("%T: %w", cmd, err)
		}
		for _, in := range fsm.NewIntents(w.s, evs) {
			if err := w.result(ctx, in); err != nil {
				return err
			}
		}
		return nil
	}
	if err := step(fsm.ConfigureNode{Meta: w.meta(), Node: "bench", Instance: "i-bench"}); err != nil {
		return built{}, err
	}
	if err := step(fsm.ConfigurePools{Meta: w.meta(), Pools: []fsm.PoolSpec{{PoolKey: keyLive}}}); err != nil {
		return built{}, err
	}
	ids := make([]string, claims)
	for i := range claims {
		w.now += 1000
		ids[i] = fmt.Sprintf("sb_%016x", i+1)
		if err := step(fsm.Claim{Meta: w.meta(), ID: ids[i], Key: keyLive, TTLSeconds: fsm.MaxTTLSeconds}); err != nil {
			return built{}, err
		}
	}
	renew := func(i int) error {
		w.now += 1000
		return step(fsm.Renew{Meta: w.meta(), Claim: ids[i%claims], TTLSeconds: fsm.MaxTTLSeconds})
	}
	i := 0
	for ; w.s.Applied() < uint64(total-tail); i++ {
		if err := renew(i); err != nil {
			return built{}, err
		}
	}
	if err := w.flush(ctx); err != nil {
		return built{}, err
	}
	snapSeq := w.s.Applied()
	data := fsm.Encode(w.s)
	if err := l.SaveSnapshot(snapSeq, data); err != nil {
		return built{}, err
	}
	for ; w.s.Applied() < uint64(total); i++ {
		if err := renew(i); err != nil {
			return built{}, err
		}
	}
	if err := w.flush(ctx); err != nil {
		return built{}, err
	}
	if l.LastSeq() != w.s.Applied() {
		return built{}, fmt.Errorf("log ends at %d, state applied %d", l.LastSeq(), w.s.Applied())
	}
	return built{events: l.LastSeq(), snapSeq: snapSeq, snapBytes: len(data), elapsed: time.Since(start)}, nil
}
