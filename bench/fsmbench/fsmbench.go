// Package fsmbench is the state machine's benchmark section (`go run ./bench
// -only fsmbench`). It measures, in one run:
//
//   - Apply throughput: a recorded fsmsim workload (claims, refills,
//     hibernates, wakes, releases, ticks, executor results) replayed into a
//     fresh state, payload decoding included;
//   - Decide latency of a warm claim and of a Tick that reaps one claim, at
//     1k and at 100k live claims, with the same state-building path as the
//     daemon (Decide + Apply); Decide+Apply of a warm claim too;
//   - Intents at both sizes (it must not scan claims).
//
// The target (issue 3): the claim and Tick costs at 100k live claims within
// 1.5x of those at 1k. The old daemon's commit was O(live claims) (~1.7 ms at
// 1000), its reap sweep O(n) under its mutex.
package fsmbench

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/fsmsim"
)

var (
	keyLive  = fsm.PoolKey{Template: "bench-live", Net: "none", Size: "small"}
	keyWarm  = fsm.PoolKey{Template: "bench-warm", Net: "none", Size: "small"}
	second   = int64(time.Second)
	startNS  = fsmsim.Start
	ttlLive  = int64(3600)
	sizes    = []int{1000, 100_000}
	decideOp uint64
)

// Run runs the section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	sec := &report.Section{
		Title: "State machine: Apply throughput, Decide latency vs live claims",
		Method: "In-process, no I/O: fsm.Decide/Apply on one goroutine. Apply: an fsmsim workload (seeded; claims, refills, " +
			"hibernate/wake, releases, ticks, executor results with failures) recorded once, then applied to a fresh state, " +
			"JSON payload decoding included; best of 3 passes. Latency: the state is built through Decide+Apply with N live " +
			"(running) claims on one pool and warm VMs on another; 'claim' is Decide of a warm-tier claim (state unchanged, " +
			"so every sample sees N live claims); 'claim+apply' also applies it and then releases it untimed; 'tick' is " +
			"Decide of a Tick at the deadline of exactly one claim (reap: claim_expired + vm_destroy_requested), after which " +
			"the events are applied and a replacement claim is made, untimed, so N stays constant; 'tick (idle)' has nothing " +
			"due. Each sample is one call timed with the monotonic clock.",
		Header: []string{"measure", "live claims", "samples", "p50", "p99", "p50 vs fewest claims"},
	}
	steps, samples := 200_000, 20_000
	if opts.Quick {
		steps, samples = 5_000, 1_000
	}

	rate, n, err := applyRate(ctx, steps)
	if err != nil {
		return nil, err
	}
	sec.AddRow("apply (events/s)", "workload", n, fmt.Sprintf("%.0f events/s", rate), "", "")

	type row struct{ claim, claimApply, tick, idle, intents report.Durations }
	rows := map[int]*row{}
	benches := map[int]*bench{}
	for _, n := range sizes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b, err := build(n)
		if err != nil {
			return nil, fmt.Errorf("build %d live claims: %w", n, err)
		}
		benches[n], rows[n] = b, &row{}
	}
	// Rounds alternate the sizes (A B B A, three times) so that load from
	// elsewhere on the machine falls on both alike; each loop starts after a
	// collection, so earlier garbage is not charged to its samples.
	rounds := 6
	order := []int{0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0}
	rounds = len(order) / len(sizes)
	for _, o := range order {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := sizes[o]
		b, r := benches[n], rows[n]
		per := samples / rounds
		var d report.Durations
		var err error
		runtime.GC()
		if d, err = b.claimDecide(per); err != nil {
			return nil, err
		}
		r.claim = append(r.claim, d...)
		runtime.GC()
		if d, err = b.claimApply(per); err != nil {
			return nil, err
		}
		r.claimApply = append(r.claimApply, d...)
		runtime.GC()
		if d, err = b.tick(min(samples, n) / rounds); err != nil {
			return nil, err
		}
		r.tick = append(r.tick, d...)
		runtime.GC()
		if d, err = b.idleTick(per); err != nil {
			return nil, err
		}
		r.idle = append(r.idle, d...)
		runtime.GC()
		r.intents = append(r.intents, b.intents(min(per, 500))...)
		if b.s.LiveClaims() != n {
			return nil, fmt.Errorf("live claims drifted to %d, want %d", b.s.LiveClaims(), n)
		}
	}
	// Snapshot cost, for restart-to-serving: encode and decode (which
	// rebuilds every index and checks the invariants) at each size.
	for _, n := range sizes {
		var enc, dec report.Durations
		var size int
		for range 3 {
			runtime.GC()
			start := time.Now()
			b := fsm.Encode(benches[n].s)
			enc = append(enc, time.Since(start))
			start = time.Now()
			back, err := fsm.Decode(b)
			dec = append(dec, time.Since(start))
			if err != nil || fsm.Hash(back) != fsm.Hash(benches[n].s) {
				return nil, fmt.Errorf("snapshot round trip at %d claims: %v", n, err)
			}
			size = len(b)
		}
		sec.Notes = append(sec.Notes, fmt.Sprintf("Snapshot at %d live claims: %.1f MiB, encode %s, decode+index rebuild+check %s (median of 3).",
			n, float64(size)/(1<<20), report.Fmt(enc.Quantile(0.5)), report.Fmt(dec.Quantile(0.5))))
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	sec.Notes = append(sec.Notes, fmt.Sprintf("Both states are alive during the run (heap %d MiB, %d objects).", ms.HeapAlloc>>20, ms.HeapObjects))
	base := *rows[sizes[0]]
	add := func(name string, get func(row) report.Durations) {
		b50 := get(base).Quantile(0.5)
		for _, n := range sizes {
			d := get(*rows[n])
			sec.AddRow(name, n, len(d), report.Fmt(d.Quantile(0.5)), report.Fmt(d.Quantile(0.99)),
				fmt.Sprintf("%.2fx", float64(d.Quantile(0.5))/float64(b50)))
		}
	}
	add("claim (Decide)", func(r row) report.Durations { return r.claim })
	add("claim+apply", func(r row) report.Durations { return r.claimApply })
	add("tick, 1 due (Decide)", func(r row) report.Durations { return r.tick })
	add("tick, nothing due", func(r row) report.Durations { return r.idle })
	add("Intents()", func(r row) report.Durations { return r.intents })

	big := *rows[sizes[len(sizes)-1]]
	verdict := func(name string, a, b report.Durations) {
		ratio := float64(b.Quantile(0.5)) / float64(a.Quantile(0.5))
		sec.Verdict(ratio <= 1.5, "%s p50 at %d live claims %s vs %s at %d: %.2fx (target <= 1.5x)", name,
			sizes[len(sizes)-1], report.Fmt(b.Quantile(0.5)), report.Fmt(a.Quantile(0.5)), sizes[0], ratio)
	}
	verdict("claim Decide", base.claim, big.claim)
	verdict("Tick Decide", base.tick, big.tick)
	sec.Notes = append(sec.Notes, fmt.Sprintf("Apply throughput %.0f events/s over %d events (payload decode included).", rate, n))
	return sec, nil
}

// applyRate records steps fsmsim commands and returns the best of three
// Apply passes over the resulting events.
func applyRate(ctx context.Context, steps int) (float64, int, error) {
	s := fsm.New()
	sim := fsmsim.New(42, fsmsim.Options{})
	var evs []event.Event
	for i := 0; i < steps; i++ {
		batch, err := fsm.Decide(s, sim.Next(s))
		if err != nil {
			if _, ok := fsm.AsRejection(err); ok {
				continue
			}
			return 0, 0, err
		}
		for j := range batch {
			batch[j].Seq = uint64(len(evs) + 1)
			if err := fsm.Apply(s, &batch[j]); err != nil {
				return 0, 0, err
			}
			evs = append(evs, batch[j])
		}
	}
	best := time.Duration(0)
	for range 3 {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		r := fsm.New()
		start := time.Now()
		for i := range evs {
			if err := fsm.Apply(r, &evs[i]); err != nil {
				return 0, 0, err
			}
		}
		el := time.Since(start)
		if fsm.Hash(r) != fsm.Hash(s) {
			return 0, 0, fmt.Errorf("replay diverged from the recorded state")
		}
		if best == 0 || el < best {
			best = el
		}
	}
	return float64(len(evs)) / best.Seconds(), len(evs), nil
}

type bench struct {
	s    *fsm.State
	now  int64
	ops  uint64
	next int // next claim id number
	// expiring are the claims in deadline order, for the tick benchmark.
	expiring []string
	reaped   int
}

func (b *bench) meta() fsm.Meta {
	b.ops++
	return fsm.Meta{Op: event.OpIDFromUint(uint64(b.now/1_000_000), b.ops), Now: b.now}
}

func (b *bench) do(cmd fsm.Command) ([]event.Event, error) {
	evs, err := fsm.Decide(b.s, cmd)
	if err != nil {
		return nil, fmt.Errorf("%T: %w", cmd, err)
	}
	for i := range evs {
		if err := fsm.Apply(b.s, &evs[i]); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

func (b *bench) claimID() string {
	b.next++
	return fmt.Sprintf("sb_%016x", b.next)
}

// fill makes n warm VMs in pool k (refill + clone results).
func (b *bench) fill(k fsm.PoolKey) error {
	evs, err := b.do(fsm.Refill{Meta: b.meta(), Key: k})
	if err != nil {
		return err
	}
	ops := map[string]event.OpID{}
	for _, in := range fsm.NewIntents(b.s, evs) {
		if c, ok := in.(fsm.CloneVM); ok {
			ops[c.VM] = c.OpID
		}
	}
	for i := range evs {
		vm := evs[i].AggID
		m := b.meta()
		m.Cause = ops[vm]
		if _, err := b.do(fsm.VMCloned{Meta: m, VM: vm}); err != nil {
			return err
		}
	}
	return nil
}

// build returns a state with n live (running) claims on keyLive, created 1 µs apart
// with a one-hour lease (so their deadlines are 1 µs apart), and warm VMs on
// keyWarm for the claim samples.
func build(n int) (*bench, error) {
	b := &bench{s: fsm.New(), now: startNS}
	if _, err := b.do(fsm.ConfigureNode{Meta: b.meta(), Node: "bench", Instance: "ib"}); err != nil {
		return nil, err
	}
	const warm = 64
	evs, err := b.do(fsm.ConfigurePools{Meta: b.meta(), Pools: []fsm.PoolSpec{{PoolKey: keyLive}, {PoolKey: keyWarm, Warm: warm}}})
	if err != nil {
		return nil, err
	}
	for _, in := range fsm.NewIntents(b.s, evs) {
		g := in.(fsm.BuildGolden)
		m := b.meta()
		m.Cause = g.OpID
		if _, err := b.do(fsm.GoldenBuilt{Meta: m, Key: g.Key, SnapshotDir: "goldens/" + g.Key.String()}); err != nil {
			return nil, err
		}
	}
	if err := b.fill(keyWarm); err != nil {
		return nil, err
	}
	for range n {
		b.now += 1000
		id := b.claimID()
		if err := b.liveClaim(id, ttlLive); err != nil {
			return nil, err
		}
		b.expiring = append(b.expiring, id)
	}
	if b.s.LiveClaims() != n {
		return nil, fmt.Errorf("%d live claims, want %d", b.s.LiveClaims(), n)
	}
	return b, nil
}

// liveClaim makes a running claim on keyLive. The pool has no warm VMs, so
// the claim takes the clone tier and its on-demand clone's result serves it.
func (b *bench) liveClaim(id string, ttl int64) error {
	evs, err := b.do(fsm.Claim{Meta: b.meta(), ID: id, Key: keyLive, TTLSeconds: ttl})
	if err != nil {
		return err
	}
	for _, in := range fsm.NewIntents(b.s, evs) {
		c := in.(fsm.CloneVM)
		m := b.meta()
		m.Cause = c.OpID
		if _, err := b.do(fsm.VMCloned{Meta: m, VM: c.VM}); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) claimDecide(samples int) (report.Durations, error) {
	d := make(report.Durations, 0, samples)
	for range samples {
		cmd := fsm.Claim{Meta: b.meta(), ID: b.claimID(), Key: keyWarm, TTLSeconds: 86400}
		start := time.Now()
		evs, err := fsm.Decide(b.s, cmd)
		d = append(d, time.Since(start))
		if err != nil || len(evs) != 1 {
			return nil, fmt.Errorf("warm claim: %d events, %v", len(evs), err)
		}
	}
	return d, nil
}

func (b *bench) claimApply(samples int) (report.Durations, error) {
	d := make(report.Durations, 0, samples)
	for range samples {
		id := b.claimID()
		cmd := fsm.Claim{Meta: b.meta(), ID: id, Key: keyWarm, TTLSeconds: 86400}
		start := time.Now()
		evs, err := fsm.Decide(b.s, cmd)
		if err == nil && len(evs) == 1 {
			err = fsm.Apply(b.s, &evs[0])
		}
		d = append(d, time.Since(start))
		if err != nil || len(evs) != 1 {
			return nil, fmt.Errorf("warm claim: %d events, %v", len(evs), err)
		}
		rel, err := b.do(fsm.Release{Meta: b.meta(), Claim: id})
		if err != nil {
			return nil, err
		}
		if err := b.destroyed(rel); err != nil {
			return nil, err
		}
		if err := b.fill(keyWarm); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// destroyed answers the destroy intents evs created, so the pending set
// stays small and Intents measures what it costs with nothing to do.
func (b *bench) destroyed(evs []event.Event) error {
	for _, in := range fsm.NewIntents(b.s, evs) {
		if dv, ok := in.(fsm.DestroyVM); ok {
			m := b.meta()
			m.Cause = dv.OpID
			if _, err := b.do(fsm.VMDestroyed{Meta: m, VM: dv.VM}); err != nil {
				return err
			}
		}
	}
	return nil
}

// tick reaps the oldest claims one per Tick, replacing each so the number
// of live claims stays the same.
func (b *bench) tick(samples int) (report.Durations, error) {
	d := make(report.Durations, 0, samples)
	for range samples {
		id := b.expiring[b.reaped]
		c, _ := b.s.Claim(id)
		b.now = max(b.now, c.Deadline)
		cmd := fsm.Tick{Meta: b.meta()}
		start := time.Now()
		evs, err := fsm.Decide(b.s, cmd)
		d = append(d, time.Since(start))
		if err != nil || len(evs) != 2 || evs[0].AggID != id {
			return nil, fmt.Errorf("tick at %s's deadline: %d events, %v", id, len(evs), err)
		}
		for i := range evs {
			if err := fsm.Apply(b.s, &evs[i]); err != nil {
				return nil, err
			}
		}
		if err := b.destroyed(evs); err != nil {
			return nil, err
		}
		b.reaped++
		if err := b.liveClaim(b.claimID(), 86400); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func (b *bench) idleTick(samples int) (report.Durations, error) {
	d := make(report.Durations, 0, samples)
	next, _ := b.s.NextTimer()
	for range samples {
		m := b.meta()
		m.Now = next - 1
		start := time.Now()
		evs, err := fsm.Decide(b.s, fsm.Tick{Meta: m})
		d = append(d, time.Since(start))
		if err != nil || len(evs) != 0 {
			return nil, fmt.Errorf("idle tick: %d events, %v", len(evs), err)
		}
	}
	return d, nil
}

func (b *bench) intents(samples int) report.Durations {
	d := make(report.Durations, 0, samples)
	for range samples {
		start := time.Now()
		_ = fsm.Intents(b.s)
		d = append(d, time.Since(start))
	}
	return d
}
