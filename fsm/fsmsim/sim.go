// Package fsmsim generates seeded, reproducible workloads for the state
// machine: a stream of valid and invalid commands (configuration, claims,
// hibernate, wake, release, renew, relays opened and closed, ticks) interleaved with the results an
// executor would report for the state's intents, some of them failures, some
// stale, VMMs dying on their own under varied restart policies, tenant
// changes (single, whole-set, from the API or the config), node drains and
// guarded egress (classes, pool policies, claims' env, usage records).
// The same seed against the same code gives the same stream, so a failing
// prefix can be replayed exactly.
//
// It is pure like fsm (its own PRNG, no clock) and is used by fsm's
// randomized test, sbxctl replay's test and the fsm benchmark.
package fsmsim

import (
	"fmt"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// Start is the simulated clock's origin (2026-09-01T00:00:00Z).
const Start = int64(1_788_220_800) * 1_000_000_000

// Options shape the workload.
type Options struct {
	// Templates is how many templates pools are drawn from (default 3).
	Templates int
	// Tenants is how many tenants claim (default 3, plus the root tenant "").
	Tenants int
	// FailPercent is the share of executor results that are failures
	// (default 15).
	FailPercent int
	// InvalidPercent is the share of commands deliberately malformed or
	// aimed at unknown entities (default 10).
	InvalidPercent int
}

// Sim is a workload generator. It is not safe for concurrent use.
type Sim struct {
	rng    rng
	opt    Options
	now    int64
	ops    uint64
	step   int
	claims []string // every claim id it asked for, in order
	stale  []fsm.Intent
	keys   []fsm.PoolKey
}

// New returns a generator seeded with seed.
func New(seed uint64, opt Options) *Sim {
	if opt.Templates <= 0 {
		opt.Templates = 3
	}
	if opt.Tenants <= 0 {
		opt.Tenants = 3
	}
	if opt.FailPercent == 0 {
		opt.FailPercent = 15
	}
	if opt.InvalidPercent == 0 {
		opt.InvalidPercent = 10
	}
	s := &Sim{rng: rng{state: seed}, opt: opt, now: Start}
	for t := range opt.Templates {
		for _, n := range fsm.Nets {
			for _, z := range fsm.Sizes[:2] {
				s.keys = append(s.keys, fsm.PoolKey{Template: fmt.Sprintf("tpl-%d", t), Net: n, Size: z.Name})
			}
		}
	}
	return s
}

// Now is the simulated time of the last command.
func (s *Sim) Now() int64 { return s.now }

// Claims returns the claim ids the generator has asked for.
func (s *Sim) Claims() []string { return s.claims }

func (s *Sim) meta() fsm.Meta {
	s.ops++
	return fsm.Meta{Op: event.OpIDFromUint(uint64(s.now/1_000_000), s.ops), Now: s.now}
}

func (s *Sim) resultMeta(in fsm.Intent) fsm.Meta {
	s.ops++
	return fsm.Meta{Op: event.DeriveOpID(in.IntentOp(), fmt.Sprintf("result/%d", s.ops)), Cause: in.IntentOp(), Now: s.now}
}

// Next returns the next command for state st. The first three commands
// configure the node, limits and pools.
func (s *Sim) Next(st *fsm.State) fsm.Command {
	s.step++
	s.now += int64(s.rng.intn(300)) * 1_000_000
	switch s.step {
	case 1:
		return fsm.ConfigureNode{Meta: s.meta(), Node: "node-sim", Instance: "isim"}
	case 2:
		return s.limits()
	case 3:
		return s.pools()
	case 4:
		return s.volumeCatalog()
	}
	if s.rng.intn(100) < s.opt.InvalidPercent {
		return s.invalid(st)
	}
	// Operator commands, rarely: tenant changes and drains (a drain is
	// short-lived, so most of the run takes claims).
	switch x := s.rng.intn(1000); {
	case x < 12:
		return s.tenants(st)
	case x < 14 && !st.Draining():
		return fsm.Drain{Meta: s.meta()}
	case x < 30 && st.Draining():
		return fsm.Uncordon{Meta: s.meta()}
	case x >= 970:
		return s.egress(st)
	case x >= 940:
		return s.store(st)
	case x >= 910:
		return s.volumeOp(st)
	case x >= 880:
		return s.checkpoint(st)
	}
	r := s.rng.intn(1000)
	switch {
	case r < 350:
		if c := s.result(st); c != nil {
			return c
		}
		return s.claim(st)
	case r < 410:
		return fsm.Refill{Meta: s.meta()}
	case r < 570:
		return s.claim(st)
	case r < 640:
		return fsm.Hibernate{Meta: s.meta(), Claim: s.someClaim(st)}
	case r < 720:
		return fsm.Wake{Meta: s.meta(), Claim: s.someClaim(st)}
	case r < 790:
		return fsm.Release{Meta: s.meta(), Claim: s.someClaim(st)}
	case r < 820:
		return fsm.Renew{Meta: s.meta(), Claim: s.someClaim(st), TTLSeconds: int64(s.rng.intn(600)),
			OnExpire: []string{"", "", event.OnExpireArchive, event.OnExpireDestroy}[s.rng.intn(4)]}
	case r < 828:
		return fsm.Touch{Meta: s.meta(), Claim: s.someClaim(st)}
	case r < 840:
		return s.relay(st)
	case r < 950:
		// Mostly short steps; sometimes far enough to expire leases,
		// serve deadlines and retention.
		switch s.rng.intn(20) {
		case 0:
			s.now += int64(s.rng.intn(3600)) * 1_000_000_000
		case 1, 2:
			s.now += int64(s.rng.intn(120)) * 1_000_000_000
		default:
			s.now += int64(s.rng.intn(2_000)) * 1_000_000
		}
		return fsm.Tick{Meta: s.meta()}
	case r < 960:
		return s.pools()
	case r < 965:
		return s.limits()
	case r < 980:
		if ids := st.VMIDs(); len(ids) > 0 {
			// Mostly the daemon's default policy, sometimes none or a
			// tight one, so restarts run out too.
			pol := fsm.DefaultRestartPolicy
			switch s.rng.intn(4) {
			case 0:
				pol = fsm.RestartPolicy{}
			case 1:
				pol = fsm.RestartPolicy{Max: 1 + s.rng.intn(2), WindowNS: int64(1+s.rng.intn(60)) * 1_000_000_000}
			}
			return fsm.VMExited{Meta: s.meta(), VM: ids[s.rng.intn(len(ids))], Detail: "exit status 1", Restart: pol}
		}
		return fsm.Tick{Meta: s.meta()}
	default:
		var k *fsm.PoolKey
		if s.rng.intn(3) > 0 {
			kk := s.keys[s.rng.intn(len(s.keys))]
			k = &kk
		}
		return fsm.CapacityFull{Meta: s.meta(), Key: k}
	}
}

func (s *Sim) limits() fsm.Command {
	c := fsm.ConfigureLimits{Meta: s.meta()}
	if s.rng.intn(3) > 0 {
		c.MaxClaims = 10 + s.rng.intn(40)
	}
	if s.rng.intn(2) == 0 {
		c.DefaultTenantCap = 3 + s.rng.intn(10)
	}
	if s.rng.intn(2) == 0 {
		c.TenantCaps = map[string]int{s.tenant(): s.rng.intn(6)}
	}
	return c
}

// tokenHash is a fake token hash (64 lowercase hex digits) for token n: a
// few tokens are shared out, so some commands reuse another tenant's.
func tokenHash(n int) string { return fmt.Sprintf("%064x", 0x5b0+n) }

// tenantSpec is a spec for one of the generator's tenants, usually with a
// token (new tenants need one), sometimes a cap or an egress class.
func (s *Sim) tenantSpec() fsm.TenantSpec {
	spec := fsm.TenantSpec{Name: fmt.Sprintf("t%d", 1+s.rng.intn(s.opt.Tenants+2))}
	if s.rng.intn(3) > 0 {
		spec.TokenSHA256 = tokenHash(s.rng.intn(8))
	}
	if s.rng.intn(2) == 0 {
		spec.MaxClaims = s.rng.intn(6)
	}
	if s.rng.intn(4) == 0 {
		spec.EgressClass = s.className()
	}
	return spec
}

// tenants changes the tenant set: one tenant put or removed, or a whole
// set (from the API or the config), valid or not.
func (s *Sim) tenants(st *fsm.State) fsm.Command {
	switch s.rng.intn(4) {
	case 0, 1:
		return fsm.PutTenant{Meta: s.meta(), Tenant: s.tenantSpec()}
	case 2:
		name := fmt.Sprintf("t%d", 1+s.rng.intn(s.opt.Tenants+2))
		if ts := st.Tenants(); len(ts) > 0 && s.rng.intn(3) > 0 {
			name = ts[s.rng.intn(len(ts))].Name
		}
		return fsm.RemoveTenant{Meta: s.meta(), Name: name}
	}
	c := fsm.SetTenants{Meta: s.meta(), FromConfig: s.rng.intn(3) == 0}
	for range s.rng.intn(4) {
		c.Tenants = append(c.Tenants, s.tenantSpec())
	}
	return c
}

func (s *Sim) pools() fsm.Command {
	c := fsm.ConfigurePools{Meta: s.meta()}
	n := 1 + s.rng.intn(4)
	seen := map[fsm.PoolKey]bool{}
	for range n {
		k := s.keys[s.rng.intn(len(s.keys))]
		if seen[k] {
			continue
		}
		seen[k] = true
		warm := s.rng.intn(5)
		sp := fsm.PoolSpec{PoolKey: k, Warm: warm}
		if s.rng.intn(2) == 0 {
			sp.WarmMax = warm + s.rng.intn(3)
		}
		if s.rng.intn(2) == 0 {
			sp.IdleHibernateSeconds = int64(5 + s.rng.intn(120))
		}
		if s.rng.intn(3) == 0 {
			// Archiving pools: archive after idle, keep the archive a
			// while or until released.
			sp.ArchiveAfterSeconds = sp.IdleHibernateSeconds + int64(1+s.rng.intn(300))
			sp.ArchiveDeleteAfterSeconds = int64(s.rng.intn(2) * (60 + s.rng.intn(3600)))
		}
		c.Pools = append(c.Pools, sp)
		if s.rng.intn(3) == 0 {
			if c.Egress == nil {
				c.Egress = map[fsm.PoolKey]*egress.Policy{}
			}
			p := s.policy(true)
			c.Egress[k] = &p
		}
	}
	return c
}

func (s *Sim) tenant() string {
	n := s.rng.intn(s.opt.Tenants + 1)
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("t%d", n)
}

func (s *Sim) claim(st *fsm.State) fsm.Command {
	id := fmt.Sprintf("sb_%016x", s.rng.next())
	s.claims = append(s.claims, id)
	c := fsm.Claim{Meta: s.meta(), ID: id, Tenant: s.tenant(), TTLSeconds: int64(s.rng.intn(900))}
	var active []fsm.PoolKey
	for _, p := range st.Pools() {
		if !p.Draining {
			active = append(active, p.Spec.PoolKey)
		}
	}
	if len(active) > 0 && s.rng.intn(10) > 0 {
		c.Key = active[s.rng.intn(len(active))]
	} else {
		c.Key = s.keys[s.rng.intn(len(s.keys))]
	}
	if s.rng.intn(4) == 0 {
		c.ServeTimeoutSeconds = int64(1 + s.rng.intn(20))
	}
	if s.rng.intn(3) == 0 {
		c.ClaimRef = fmt.Sprintf("job-%d", s.rng.intn(50))
		c.Metadata = map[string]string{"user": fmt.Sprintf("u%d", s.rng.intn(5)), "x": "y"}
	}
	if s.rng.intn(10) == 0 {
		c.NoEgress = true
	}
	if s.rng.intn(8) == 0 {
		c.Env = s.env(1 + s.rng.intn(3))
	}
	if s.rng.intn(4) == 0 {
		c.OnExpire = event.OnExpireArchive
	}
	if s.rng.intn(6) == 0 {
		s.claimVolumes(&c)
	}
	return c
}

// someClaim returns a claim id: mostly one in st, sometimes one the
// generator asked for that may have been rejected or forgotten.
func (s *Sim) someClaim(st *fsm.State) string {
	if s.rng.intn(5) > 0 {
		var live []string
		for _, id := range st.ClaimIDs() {
			if c, _ := st.Claim(id); c.Status.Live() {
				live = append(live, id)
			}
		}
		if len(live) > 0 {
			return live[s.rng.intn(len(live))]
		}
	}
	if len(s.claims) == 0 {
		return "sb_0000000000000000"
	}
	// Bias towards recent claims, which are more likely live.
	n := len(s.claims)
	if s.rng.intn(2) == 0 {
		return s.claims[n-1-s.rng.intn(min(n, 20))]
	}
	return s.claims[s.rng.intn(n)]
}

// relay opens a relay to some claim (mostly a running one), closes an
// open one, or, rarely, closes them all as a starting node does.
func (s *Sim) relay(st *fsm.State) fsm.Command {
	switch s.rng.intn(12) {
	case 0:
		return fsm.CloseAllRelays{Meta: s.meta(), Reason: fsm.RelayClosedRestart}
	case 1, 2, 3, 4, 5:
		var open []string
		for _, id := range st.ClaimIDs() {
			open = append(open, st.RelaysOf(id)...)
		}
		if len(open) > 0 {
			return fsm.CloseRelay{Meta: s.meta(), ID: open[s.rng.intn(len(open))], Reason: "client",
				BytesIn: int64(s.rng.intn(1 << 20)), BytesOut: int64(s.rng.intn(1 << 20))}
		}
	}
	kind := []string{fsm.RelayAgent, fsm.RelayPort, fsm.RelayExec}[s.rng.intn(3)]
	port := 0
	if kind == fsm.RelayPort {
		port = 1 + s.rng.intn(65535)
	}
	return fsm.OpenRelay{Meta: s.meta(), ID: fmt.Sprintf("rl_%016x", s.rng.next()), Claim: s.someClaim(st), Kind: kind, Port: port,
		Passive: kind == fsm.RelayPort && s.rng.intn(3) == 0}
}

// result answers one of st's intents, as an executor would.
func (s *Sim) result(st *fsm.State) fsm.Command {
	ins := fsm.Intents(st)
	if len(ins) == 0 {
		return nil
	}
	// Favour the front of the queue, as the executors' priorities do.
	in := ins[min(len(ins)-1, s.rng.intn(len(ins))/2+s.rng.intn(2))]
	if len(s.stale) < 64 {
		s.stale = append(s.stale, in)
	} else {
		s.stale[s.rng.intn(len(s.stale))] = in
	}
	fail := s.rng.intn(100) < s.opt.FailPercent
	m := s.resultMeta(in)
	rep := &event.ExecReport{Steps: []event.Step{{Name: "run", NS: int64(s.rng.intn(50_000_000))}}, CopyMode: "reflink"}
	switch in := in.(type) {
	case fsm.BuildGolden:
		if fail || s.rng.intn(4) == 0 {
			return fsm.GoldenFailed{Meta: m, Key: in.Key, Error: "vm.boot: 500"}
		}
		return fsm.GoldenBuilt{Meta: m, Key: in.Key, SnapshotDir: fmt.Sprintf("goldens/%s/%d", in.Key, s.ops), Report: rep}
	case fsm.CloneVM:
		if fail {
			return fsm.VMCloneFailed{Meta: m, VM: in.VM, Error: "vm.restore: 500"}
		}
		return fsm.VMCloned{Meta: m, VM: in.VM, Report: rep}
	case fsm.HibernateVM:
		if fail {
			return fsm.HibernateFailed{Meta: m, VM: in.VM, Error: "vm.snapshot: 500", Lost: s.rng.intn(3) == 0}
		}
		return fsm.HibernateDone{Meta: m, VM: in.VM, SnapshotDir: fmt.Sprintf("snapshots/%s/%d", in.VM, s.ops), Report: rep}
	case fsm.WakeVM:
		if fail {
			return fsm.WakeFailed{Meta: m, VM: in.VM, Error: "vm.restore: 500", Lost: s.rng.intn(3) == 0}
		}
		return fsm.WakeDone{Meta: m, VM: in.VM, Report: rep}
	case fsm.DestroyVM:
		return fsm.VMDestroyed{Meta: m, VM: in.VM}
	case fsm.RestartVM:
		if fail {
			return fsm.VMRestartFailed{Meta: m, VM: in.VM, Error: "vm.boot: 500"}
		}
		return fsm.VMRestarted{Meta: m, VM: in.VM, Report: rep}
	case fsm.CaptureCheckpoint:
		if fail {
			return fsm.CheckpointFailed{Meta: m, Checkpoint: in.Checkpoint, Error: "vm.snapshot: 500", Lost: s.rng.intn(3) == 0}
		}
		return fsm.CheckpointTaken{Meta: m, Checkpoint: in.Checkpoint, SnapshotDir: "checkpoint/" + in.Checkpoint, Report: rep}
	case fsm.RemoveCheckpoint:
		return fsm.CheckpointRemoved{Meta: m, Checkpoint: in.Checkpoint}
	case fsm.FetchCheckpoint:
		return s.importResult(in, m, fail, rep)
	case fsm.PromoteVM:
		if fail {
			return fsm.PromoteFailed{Meta: m, VM: in.VM, Error: "vm.snapshot: 500", Lost: s.rng.intn(3) == 0}
		}
		return fsm.PromoteDone{Meta: m, VM: in.VM, SnapshotDir: fmt.Sprintf("template/%s/%d", in.Target, s.ops), Digest: fmt.Sprintf("sha256:%064x", s.ops), Report: rep}
	case fsm.CollectSnapshot:
		return fsm.SnapshotCollected{Meta: m, Dir: in.Dir}
	case fsm.AttachVolume, fsm.DetachVolume:
		return s.volumeResult(in, m, fail)
	case fsm.ArchiveVM:
		if fail {
			return fsm.ArchiveFailed{Meta: m, VM: in.VM, Error: "archive put: ENOSPC", Lost: s.rng.intn(4) == 0}
		}
		return fsm.ArchiveDone{Meta: m, VM: in.VM, Archive: fmt.Sprintf("isim/%s-%d", in.VM, s.ops), Report: rep}
	case fsm.UnarchiveVM:
		if fail {
			return fsm.UnarchiveFailed{Meta: m, VM: in.VM, Error: "memory-ranges: sha256 mismatch", Lost: s.rng.intn(3) == 0}
		}
		return fsm.UnarchiveDone{Meta: m, VM: in.VM, SnapshotDir: fmt.Sprintf("snapshots/%s/%d", in.VM, s.ops), Report: rep}
	case fsm.DeleteArchiveVM:
		return fsm.VMDestroyed{Meta: m, VM: in.VM}
	}
	return nil
}

// store promotes a claim into a template, deletes or labels a template, or
// rebuilds a pool's golden.
func (s *Sim) store(st *fsm.State) fsm.Command {
	name := fmt.Sprintf("tpl-p%d", s.rng.intn(3))
	ts := st.Templates()
	switch s.rng.intn(6) {
	case 0, 1, 2:
		return fsm.Promote{Meta: s.meta(), Claim: s.someClaim(st), Template: name, Tenant: s.tenant()}
	case 3:
		if len(ts) > 0 {
			return fsm.DeleteTemplate{Meta: s.meta(), Key: ts[s.rng.intn(len(ts))].Key, Tenant: s.tenant()}
		}
	case 4:
		if len(ts) > 0 {
			return fsm.SetTemplateLabels{Meta: s.meta(), Key: ts[s.rng.intn(len(ts))].Key, Tenant: s.tenant(),
				Labels: map[string]string{"v": fmt.Sprint(s.rng.intn(3))}}
		}
	}
	return fsm.RebuildGolden{Meta: s.meta(), Key: s.keys[s.rng.intn(len(s.keys))]}
}

// invalid returns a command that should be rejected or ignored: malformed
// input, unknown ids, stale executor results.
func (s *Sim) invalid(st *fsm.State) fsm.Command {
	switch s.rng.intn(13) {
	case 0:
		return fsm.Claim{Meta: s.meta(), ID: "sb_BAD", Key: s.keys[0]}
	case 1:
		c := s.claim(st).(fsm.Claim)
		c.TTLSeconds = []int64{-1, fsm.MaxTTLSeconds + 1}[s.rng.intn(2)]
		return c
	case 2:
		c := s.claim(st).(fsm.Claim)
		c.Key = fsm.PoolKey{Template: "no such template!", Net: "none", Size: "small"}
		return c
	case 3:
		if len(s.claims) > 0 {
			c := s.claim(st).(fsm.Claim)
			c.ID = s.claims[s.rng.intn(len(s.claims))]
			return c
		}
		return fsm.Release{Meta: s.meta(), Claim: "sb_ffffffffffffffff"}
	case 4:
		return fsm.Release{Meta: s.meta(), Claim: fmt.Sprintf("sb_%016x", s.rng.next())}
	case 5:
		return fsm.Wake{Meta: s.meta(), Claim: "sb_nothex"}
	case 6:
		if len(s.stale) > 0 {
			in := s.stale[s.rng.intn(len(s.stale))]
			m := s.resultMeta(in)
			switch in := in.(type) {
			case fsm.CloneVM:
				return fsm.VMCloned{Meta: m, VM: in.VM}
			case fsm.HibernateVM:
				return fsm.HibernateDone{Meta: m, VM: in.VM, SnapshotDir: "snapshots/stale"}
			case fsm.WakeVM:
				return fsm.WakeDone{Meta: m, VM: in.VM}
			case fsm.DestroyVM:
				return fsm.VMDestroyed{Meta: m, VM: in.VM}
			case fsm.BuildGolden:
				return fsm.GoldenBuilt{Meta: m, Key: in.Key, SnapshotDir: "goldens/stale"}
			case fsm.RestartVM:
				return fsm.VMRestarted{Meta: m, VM: in.VM}
			case fsm.PromoteVM:
				return fsm.PromoteDone{Meta: m, VM: in.VM, SnapshotDir: "template/stale"}
			case fsm.CollectSnapshot:
				return fsm.SnapshotCollected{Meta: m, Dir: in.Dir}
			case fsm.ArchiveVM:
				return fsm.ArchiveDone{Meta: m, VM: in.VM, Archive: "isim/stale"}
			case fsm.UnarchiveVM:
				return fsm.UnarchiveDone{Meta: m, VM: in.VM, SnapshotDir: "snapshots/stale"}
			}
		}
		return fsm.VMDestroyed{Meta: s.meta(), VM: "vm-0000000000000000"}
	case 7:
		ins := fsm.Intents(st)
		if len(ins) > 0 {
			// Right VM, wrong cause.
			if in, ok := ins[s.rng.intn(len(ins))].(fsm.CloneVM); ok {
				return fsm.VMCloned{Meta: s.meta(), VM: in.VM}
			}
		}
		return fsm.GoldenFailed{Meta: s.meta(), Key: s.keys[0], Error: "x"}
	case 8:
		return fsm.Tick{Meta: fsm.Meta{Now: s.now}} // no op id
	case 9:
		return fsm.ConfigurePools{Meta: s.meta(), Pools: []fsm.PoolSpec{{PoolKey: s.keys[0], Warm: 3, WarmMax: 1}}}
	case 10:
		return fsm.Renew{Meta: s.meta(), Claim: s.someClaim(st), TTLSeconds: -5}
	case 11:
		// A malformed relay: bad id, or a port relay without a port.
		if s.rng.intn(2) == 0 {
			return fsm.OpenRelay{Meta: s.meta(), ID: "rl_BAD", Claim: s.someClaim(st), Kind: fsm.RelayAgent}
		}
		return fsm.OpenRelay{Meta: s.meta(), ID: fmt.Sprintf("rl_%016x", s.rng.next()), Claim: s.someClaim(st), Kind: fsm.RelayPort}
	default:
		return fsm.Refill{Meta: s.meta(), Key: fsm.PoolKey{Template: "nope", Net: "none", Size: "small"}}
	}
}

// rng is splitmix64: tiny, fast and reproducible everywhere.
type rng struct{ state uint64 }

func (r *rng) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a number in [0, n); n must be > 0.
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }
