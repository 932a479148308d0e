package proxy

import (
	"slices"
	"strings"
	"sync"
)

// rule is the fake policy's rule: a host (exact, "*.suffix" or "*"), the
// secret it injects and whether it intercepts.
type rule struct {
	host      string
	secret    string
	intercept Intercept
}

func (r rule) matches(host string) bool {
	switch {
	case r.host == "*":
		return true
	case strings.HasPrefix(r.host, "*."):
		return strings.HasSuffix(host, r.host[1:])
	}
	return r.host == host
}

// fakePolicies is Policies over maps a test changes at will.
type fakePolicies struct {
	mu        sync.Mutex
	sandboxOf map[string]string // VM -> sandbox
	rules     map[string][]rule // sandbox -> rules
	socks     map[string]bool
	secrets   map[string][2]string // name -> header, value
}

func newFakePolicies() *fakePolicies {
	return &fakePolicies{sandboxOf: map[string]string{}, rules: map[string][]rule{}, socks: map[string]bool{}, secrets: map[string][2]string{}}
}

func (f *fakePolicies) setRules(sb string, rs ...rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules[sb] = rs
}

func (f *fakePolicies) SandboxOfVM(vm string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxOf[vm]
	return sb, ok
}

func (f *fakePolicies) match(sb, host string, keep func(rule) bool) (rule, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules[sb] {
		if r.matches(host) && keep(r) {
			return r, true
		}
	}
	return rule{}, false
}

func (f *fakePolicies) Decide(sb, host, _ string, _ uint16) Decision {
	r, ok := f.match(sb, host, func(r rule) bool { return r.intercept != InterceptAlways })
	if !ok {
		return Decision{Reason: "no_rule"}
	}
	return Decision{Allow: true, Secret: r.secret}
}

func (f *fakePolicies) DecideTunnel(sb, host string, _ uint16, t Tunnel) Decision {
	r, ok := f.match(sb, host, func(rule) bool { return true })
	if !ok {
		return Decision{Reason: "no_rule"}
	}
	if r.intercept == InterceptAlways || (r.intercept == InterceptInject && t.HasCredential) {
		if t.Socks || !t.CanIntercept {
			return Decision{Reason: "intercept"}
		}
		return Decision{Allow: true, Intercept: r.intercept}
	}
	return Decision{Allow: true}
}

func (f *fakePolicies) DecideInner(sb, host, _ string, _ uint16, mode Intercept) Decision {
	r, ok := f.match(sb, host, func(r rule) bool { return r.intercept == mode })
	if !ok {
		return Decision{Reason: "no_rule"}
	}
	return Decision{Allow: true, Secret: r.secret, Intercept: mode}
}

func (f *fakePolicies) ServesSocks(sb string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.socks[sb]
}

func (f *fakePolicies) Intercepts(sb string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.rules[sb], func(r rule) bool { return r.intercept != InterceptOff })
}

func (f *fakePolicies) HasCredential(string, string) bool { return false }

func (f *fakePolicies) Secret(_, name string) (string, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.secrets[name]
	return s[0], s[1], ok
}

// fakeMeter records what the proxy reports.
type fakeMeter struct {
	mu        sync.Mutex
	decisions []string // "sandbox door allow|reason"
	tx, rx    map[string]int64
	transfers int
	closed    []string
}

func newFakeMeter() *fakeMeter { return &fakeMeter{tx: map[string]int64{}, rx: map[string]int64{}} }

func (m *fakeMeter) Decision(sb, door string, d Decision) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := "allow"
	if !d.Allow {
		out = d.Reason
	}
	m.decisions = append(m.decisions, sb+" "+door+" "+out)
}

func (m *fakeMeter) Transfer(sb string, tx, rx int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tx[sb] += tx
	m.rx[sb] += rx
	m.transfers++
}

func (m *fakeMeter) Close(sb string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = append(m.closed, sb)
}
