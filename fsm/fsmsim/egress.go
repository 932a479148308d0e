package fsmsim

import (
	"fmt"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// classNames are the egress classes the generator puts and tenants name.
var classNames = []string{"desk", "ops", "wide"}

func (s *Sim) className() string { return classNames[s.rng.intn(len(classNames))] }

// policy returns a valid policy, sometimes a pool's with interception and
// SOCKS5 (pool), else one a class may hold.
func (s *Sim) policy(pool bool) egress.Policy {
	var p egress.Policy
	hosts := []string{"*", "*.github.com", "api.example.com", "10.8.0.1"}
	for range s.rng.intn(4) {
		r := egress.Rule{Host: hosts[s.rng.intn(len(hosts))]}
		if s.rng.intn(3) == 0 {
			r.Methods = []string{"GET", "CONNECT"}[:1+s.rng.intn(2)]
		}
		if s.rng.intn(3) == 0 {
			r.Ports = []uint16{443, 80}[:1+s.rng.intn(2)]
		}
		if pool {
			switch s.rng.intn(5) {
			case 0:
				r.Intercept = egress.InterceptAlways
				r.Secret = "gh"
			case 1:
				r.Intercept = egress.InterceptInject
			}
		}
		p.Allow = append(p.Allow, r)
	}
	if pool && s.rng.intn(3) == 0 {
		p.Allow = append(p.Allow, egress.Rule{Host: "*"})
		p.Socks5 = true
	}
	return p
}

// env returns n entries with made-up sealed values, sometimes a
// credential, sometimes a duplicate name (rejected).
func (s *Sim) env(n int) []egress.EnvEntry {
	names := []string{"MODE", "GW_KEY", "API_TOKEN", "REGION"}
	out := make([]egress.EnvEntry, 0, n)
	for range n {
		e := egress.EnvEntry{Name: names[s.rng.intn(len(names))], Sealed: fmt.Sprintf("k1:%x", s.rng.next()), Size: s.rng.intn(64), HostOnly: s.rng.intn(2) == 0}
		if e.HostOnly && s.rng.intn(3) == 0 {
			e.Inject = &egress.EnvInject{Hosts: []string{"api.example.com"}, Header: "X-Api-Key"}
		}
		out = append(out, e)
	}
	return out
}

// egress changes guarded egress: a class put, removed or the whole set,
// a claim's env, or the usage of a few claims.
func (s *Sim) egress(st *fsm.State) fsm.Command {
	switch s.rng.intn(8) {
	case 0, 1:
		return fsm.PutEgressClass{Meta: s.meta(), Class: fsm.EgressClassSpec{Name: s.className(), Policy: s.policy(s.rng.intn(6) == 0)}}
	case 2:
		return fsm.RemoveEgressClass{Meta: s.meta(), Name: s.className()}
	case 3:
		c := fsm.SetEgressClasses{Meta: s.meta(), FromConfig: s.rng.intn(2) == 0}
		for _, n := range classNames[:s.rng.intn(len(classNames)+1)] {
			c.Classes = append(c.Classes, fsm.EgressClassSpec{Name: n, Policy: s.policy(false)})
		}
		return c
	case 4, 5:
		c := fsm.SetClaimEnv{Meta: s.meta(), Claim: s.someClaim(st), Replace: s.rng.intn(4) == 0, Set: s.env(s.rng.intn(3))}
		if s.rng.intn(2) == 0 {
			c.Remove = []string{"MODE", "GW_KEY"}[:1+s.rng.intn(2)]
		}
		return c
	}
	c := fsm.RecordEgressUsage{Meta: s.meta()}
	for range 1 + s.rng.intn(3) {
		from := s.now - int64(s.rng.intn(60))*1_000_000_000
		c.Usage = append(c.Usage, fsm.EgressUsage{Claim: s.someClaim(st), FromNS: from, ToNS: s.now,
			Tx: int64(s.rng.intn(1 << 20)), Rx: int64(s.rng.intn(1 << 20)), Allowed: int64(s.rng.intn(50)), Denied: int64(s.rng.intn(3)), Final: s.rng.intn(4) == 0})
	}
	return c
}
