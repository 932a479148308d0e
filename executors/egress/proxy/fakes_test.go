package proxy

import (
	"sync"

	"github.com/sbxlog/sbxlog/fsm/egress"
)

// rule is a test's shorthand for an egress rule: a host (exact, "*.suffix"
// or "*"), the secret it injects and whether it intercepts.
type rule struct {
	host      string
	secret    string
	intercept egress.Intercept
}

// fakePolicies is Policies over maps a test changes at will; the policy
// a sandbox has is its rules as a pool's (decided by fsm/egress).
type fakePolicies struct {
	mu        sync.Mutex
	sandboxOf map[string]string              // VM -> sandbox
	rules     map[string][]egress.Rule       // sandbox -> rules (absent: no policy)
	socks     map[string]bool                // sandbox -> socks5 opted in
	secrets   map[string][2]string           // name -> header, value
	creds     map[string][]egress.Credential // sandbox -> claim credentials
}

func newFakePolicies() *fakePolicies {
	return &fakePolicies{sandboxOf: map[string]string{}, rules: map[string][]egress.Rule{}, socks: map[string]bool{},
		secrets: map[string][2]string{}, creds: map[string][]egress.Credential{}}
}

func (f *fakePolicies) setRules(sb string, rs ...rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []egress.Rule{}
	for _, r := range rs {
		out = append(out, egress.Rule{Host: r.host, Secret: r.secret, Intercept: r.intercept})
	}
	f.rules[sb] = out
}

func (f *fakePolicies) SandboxOfVM(vm string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxOf[vm]
	return sb, ok
}

func (f *fakePolicies) Policy(sb string) (egress.Effective, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs, ok := f.rules[sb]
	if !ok {
		return egress.Effective{}, false
	}
	return egress.Effective{Base: &egress.Policy{Allow: rs, Socks5: f.socks[sb]}}, true
}

func (f *fakePolicies) SecretsFor(string) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for name, s := range f.secrets {
		out[name] = s[1]
	}
	return out, nil
}

func (f *fakePolicies) SecretHeader(name string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.secrets[name]
	return s[0], ok
}

func (f *fakePolicies) Credentials(sb string) ([]egress.Credential, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.creds[sb], nil
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

func (m *fakeMeter) Decision(sb, door string, d egress.Decision) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := "allow"
	if !d.Allow {
		out = string(d.Reason)
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
