package egress

import (
	"strings"
	"testing"
)

func pol(socks bool, rules ...Rule) *Policy {
	p := Normalize(Policy{Allow: rules, Socks5: socks})
	return &p
}

// The old daemon's resolution table.
func TestResolve(t *testing.T) {
	pool, class := pol(false, Rule{Host: "*"}), pol(false, Rule{Host: "api.github.com"})
	for _, tc := range []struct {
		name string
		c    Claim
		want Effective
		ok   bool
	}{
		{"egress false", Claim{NoEgress: true, Pool: pool}, Effective{}, false},
		{"egress false, tenant with a class", Claim{NoEgress: true, Tenant: "t", Pool: pool, Class: class}, Effective{}, false},
		{"pool, root", Claim{Pool: pool, Class: class}, Effective{Base: pool}, true},
		{"pool, tenant with a class", Claim{Tenant: "t", Pool: pool, Class: class}, Effective{Base: pool, Tenant: class}, true},
		{"pool, tenant without a class", Claim{Tenant: "t", Pool: pool}, Effective{}, false},
		{"no pool policy, pooled key, tenant with a class", Claim{Tenant: "t", Class: class}, Effective{}, false},
		{"no pool policy, unpooled key, tenant with a class", Claim{Tenant: "t", Unpooled: true, Class: class}, Effective{Base: class}, true},
		{"no pool policy, unpooled key, root", Claim{Unpooled: true, Class: class}, Effective{}, false},
		{"no pool policy, unpooled key, tenant without a class", Claim{Tenant: "t", Unpooled: true}, Effective{}, false},
		{"pool, unpooled at claim, tenant with a class", Claim{Tenant: "t", Unpooled: true, Pool: pool, Class: class}, Effective{Base: pool, Tenant: class}, true},
	} {
		got, ok := Resolve(tc.c)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: Resolve = %+v %v, want %+v %v", tc.name, got, ok, tc.want, tc.ok)
		}
		if ok != got.Valid() {
			t.Errorf("%s: ok %v but Valid %v", tc.name, ok, got.Valid())
		}
	}
}

type req struct {
	host, method string
	port         uint16
}

// Decide on one policy: first match, default deny, methods and ports,
// always-intercept rules skipped.
func TestDecideOnePolicy(t *testing.T) {
	e := Effective{Base: pol(false,
		Rule{Host: "api.github.com", Methods: []string{"GET", "post"}, Ports: []uint16{443}, Secret: "gh"},
		Rule{Host: "api.github.com", Methods: []string{"DELETE"}},
		Rule{Host: "*.googleapis.com"},
		Rule{Host: "vault.example.com", Secret: "v", Intercept: InterceptAlways},
		Rule{Host: "10.8.0.1", Ports: []uint16{18090}},
	)}
	for _, tc := range []struct {
		r      req
		allow  bool
		secret string
		reason Reason
	}{
		{req{"api.github.com", "GET", 443}, true, "gh", ""},
		{req{"API.GITHUB.COM", "post", 443}, true, "gh", ""},
		{req{"api.github.com", "GET", 80}, false, "", ReasonNoRule},
		{req{"api.github.com", "PUT", 443}, false, "", ReasonNoRule},
		{req{"api.github.com", "DELETE", 8443}, true, "", ""},
		{req{"storage.googleapis.com", "PUT", 443}, true, "", ""},
		{req{"googleapis.com", "GET", 443}, false, "", ReasonNoRule},
		// The host's only rule intercepts: a plain request is refused.
		{req{"vault.example.com", "GET", 443}, false, "", ReasonNoRule},
		{req{"10.8.0.1", "GET", 18090}, true, "", ""},
		{req{"10.8.0.1", "GET", 22}, false, "", ReasonNoRule},
		{req{"evil.example", "GET", 80}, false, "", ReasonNoRule},
		{req{"api.github.com", "GET", 0}, false, "", ReasonBadPort},
	} {
		d := Decide(e, tc.r.host, tc.r.method, tc.r.port)
		if d.Allow != tc.allow || d.Secret != tc.secret || d.Reason != tc.reason {
			t.Errorf("Decide(%v) = %+v", tc.r, d)
		}
		if d.Allow && d.Rule.Host == "" {
			t.Errorf("Decide(%v): allowed without a rule", tc.r)
		}
	}
	if d := Decide(Effective{}, "a", "GET", 80); d.Allow || d.Reason != ReasonNoPolicy {
		t.Errorf("no policy: %+v", d)
	}
	if d := Decide(Effective{Base: pol(false)}, "a", "GET", 80); d.Allow || d.Reason != ReasonNoRule {
		t.Errorf("empty allow list: %+v", d)
	}
}

// Composition is per request: both layers must allow, each with its own
// first matching rule, and the pool's rule (its secret) wins.
func TestDecideComposed(t *testing.T) {
	pool := pol(false,
		Rule{Host: "*.github.com", Secret: "pool-gh"},
		Rule{Host: "*.example.com", Methods: []string{"GET"}},
		Rule{Host: "*"},
	)
	class := pol(false,
		Rule{Host: "api.github.com", Secret: "class-gh"},
		Rule{Host: "www.example.com", Methods: []string{"POST", "GET"}},
		Rule{Host: "only.class.com"},
		Rule{Host: "ports.example.org", Ports: []uint16{443}},
	)
	e := Effective{Base: pool, Tenant: class}
	for _, tc := range []struct {
		r      req
		allow  bool
		secret string
	}{
		{req{"api.github.com", "GET", 443}, true, "pool-gh"}, // double allow: the pool's rule
		{req{"raw.github.com", "GET", 443}, false, ""},       // the class has no rule
		{req{"www.example.com", "GET", 443}, true, ""},       // both allow GET
		{req{"www.example.com", "POST", 443}, true, ""},      // the pool's first match for POST is "*"
		{req{"only.class.com", "GET", 80}, true, ""},         // the pool's "*"
		{req{"ports.example.org", "GET", 443}, true, ""},     // the class's port
		{req{"ports.example.org", "GET", 8443}, false, ""},   // the class's port refuses
		{req{"elsewhere.net", "GET", 443}, false, ""},        // the class refuses
		{req{"www.example.com", "DELETE", 443}, false, ""},   // the class's only rule is POST, GET
		{req{"api.github.com", MethodConnect, 443}, true, "pool-gh"},
	} {
		d := Decide(e, tc.r.host, tc.r.method, tc.r.port)
		if d.Allow != tc.allow || d.Secret != tc.secret {
			t.Errorf("Decide(%v) = %+v", tc.r, d)
		}
	}
}

// Tunnels: interception by EvalHost's top rule when the proxy can
// intercept, else a spliced tunnel by Eval with CONNECT.
func TestDecideTunnel(t *testing.T) {
	e := Effective{Base: pol(true,
		Rule{Host: "api.github.com", Ports: []uint16{443}, Secret: "gh", Intercept: InterceptAlways},
		Rule{Host: "*.openai.com", Intercept: InterceptInject},
		Rule{Host: "get.only.com", Methods: []string{"GET"}},
		Rule{Host: "plain.com", Secret: "p"},
		Rule{Host: "*.openai.com", Secret: "never"},
	)}
	ca := Tunnel{CanIntercept: true}
	cred := Tunnel{CanIntercept: true, HasCredential: true}
	socks := Tunnel{CanIntercept: true, HasCredential: true, Socks: true}
	for _, tc := range []struct {
		name   string
		host   string
		port   uint16
		t      Tunnel
		allow  bool
		mode   Intercept
		reason Reason
	}{
		{"always rule, CA", "api.github.com", 443, ca, true, InterceptAlways, ""},
		{"always rule, no CA", "api.github.com", 443, Tunnel{}, false, InterceptOff, ReasonNoRule},
		{"always rule, other port", "api.github.com", 8443, ca, false, InterceptOff, ReasonNoRule},
		{"inject rule, no credential: spliced", "chat.openai.com", 443, ca, true, InterceptOff, ""},
		{"inject rule, credential: intercepted", "chat.openai.com", 443, cred, true, InterceptInject, ""},
		{"inject rule on SOCKS: plain", "chat.openai.com", 443, socks, true, InterceptOff, ""},
		{"always rule on SOCKS: denied", "api.github.com", 443, socks, false, InterceptOff, ReasonIntercept},
		{"methods without CONNECT deny the tunnel", "get.only.com", 443, ca, false, InterceptOff, ReasonNoRule},
		{"a rule's secret is not put in a spliced tunnel", "plain.com", 443, ca, true, InterceptOff, ""},
		{"port 0", "plain.com", 0, ca, false, InterceptOff, ReasonBadPort},
		{"no rule", "evil.example", 443, ca, false, InterceptOff, ReasonNoRule},
	} {
		d := DecideTunnel(e, tc.host, tc.port, tc.t)
		if d.Allow != tc.allow || d.Intercept != tc.mode || d.Reason != tc.reason || d.Secret != "" {
			t.Errorf("%s: %+v", tc.name, d)
		}
	}
	if d := DecideTunnel(Effective{}, "a", 443, ca); d.Allow || d.Reason != ReasonNoPolicy {
		t.Errorf("no policy: %+v", d)
	}
}

// Inside an intercepted tunnel only rules of its mode count: a plain rule
// neither rescues nor shadows an intercept rule; the class is asked as
// for a plain request.
func TestDecideInner(t *testing.T) {
	pool := pol(false,
		Rule{Host: "api.github.com", Methods: []string{"GET"}, Secret: "gh", Intercept: InterceptAlways},
		Rule{Host: "api.github.com"},
		Rule{Host: "*.openai.com", Intercept: InterceptInject},
	)
	e := Effective{Base: pool}
	if d := DecideInner(e, "api.github.com", "GET", 443, InterceptAlways); !d.Allow || d.Secret != "gh" || d.Intercept != InterceptAlways {
		t.Errorf("GET: %+v", d)
	}
	if d := DecideInner(e, "api.github.com", "POST", 443, InterceptAlways); d.Allow {
		t.Errorf("POST rescued by the plain rule: %+v", d)
	}
	if d := DecideInner(e, "chat.openai.com", "POST", 443, InterceptInject); !d.Allow || d.Secret != "" {
		t.Errorf("inject: %+v", d)
	}
	composed := Effective{Base: pool, Tenant: pol(false, Rule{Host: "api.github.com", Methods: []string{"POST"}})}
	if d := DecideInner(composed, "api.github.com", "GET", 443, InterceptAlways); d.Allow {
		t.Errorf("class refuses GET: %+v", d)
	}
}

func TestServesSocksAndInterceptsHost(t *testing.T) {
	pool := pol(true, Rule{Host: "*.github.com", Intercept: InterceptAlways}, Rule{Host: "*"}, Rule{Host: "api.openai.com", Intercept: InterceptInject})
	class := pol(false, Rule{Host: "api.github.com"})
	alone := Effective{Base: pool}
	composed := Effective{Base: pool, Tenant: class}
	if !alone.ServesSocks() || !composed.ServesSocks() || (Effective{Base: class}).ServesSocks() || (Effective{}).ServesSocks() {
		t.Fatal("ServesSocks is the base's opt-in")
	}
	if !composed.Intercepts() || (Effective{Base: class}).Intercepts() {
		t.Fatal("Intercepts")
	}
	for _, tc := range []struct {
		e       Effective
		pattern string
		want    bool
	}{
		{alone, "api.github.com", true},
		{alone, "*.github.com", true},
		{alone, "*.api.github.com", true},
		{alone, "github.com", false},
		{alone, "api.openai.com", true},
		{alone, "example.com", false},
		{composed, "api.github.com", true},
		{composed, "raw.github.com", false}, // the class does not cover it
		{composed, "*.github.com", false},
		{Effective{}, "api.github.com", false},
	} {
		if got := tc.e.InterceptsHost(tc.pattern); got != tc.want {
			t.Errorf("InterceptsHost(%q) = %v", tc.pattern, got)
		}
	}
}

func TestInjectGap(t *testing.T) {
	e := Effective{Base: pol(false,
		Rule{Host: "api.github.com", Secret: "gh", Intercept: InterceptAlways},
		Rule{Host: "*.openai.com", Intercept: InterceptInject},
	)}
	header := func(s string) string {
		if s == "gh" {
			return "Authorization"
		}
		return ""
	}
	for _, tc := range []struct {
		in   EnvInject
		want string
	}{
		{EnvInject{Hosts: []string{"chat.openai.com"}, Header: "Authorization"}, ""},
		{EnvInject{Hosts: []string{"api.github.com"}, Header: "X-Api-Key"}, ""},
		{EnvInject{Hosts: []string{"api.github.com"}, Header: "authorization"}, "KEY: the pool's secret already sets authorization on api.github.com"},
		{EnvInject{Hosts: []string{"chat.openai.com", "example.com"}, Header: "X"}, "KEY: example.com is not intercepted"},
		{EnvInject{Hosts: []string{"api.github.com"}, Query: "key", Placeholder: "P"}, ""},
	} {
		err := InjectGap(e, "KEY", tc.in, header)
		if (err == nil) != (tc.want == "") || (err != nil && err.Error() != tc.want) {
			t.Errorf("InjectGap(%+v) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestValidEnv(t *testing.T) {
	ent := func(name string, size int) EnvEntry { return EnvEntry{Name: name, Sealed: "k:x", Size: size} }
	good := []EnvEntry{ent("A", 1), {Name: "B", Sealed: "k:x", HostOnly: true, Inject: &EnvInject{Hosts: []string{"a.com", "*.b.com"}, Header: "X-Key"}}}
	if err := ValidEnv(good); err != nil {
		t.Fatal(err)
	}
	tooMany := make([]EnvEntry, MaxEnvEntries+1)
	for i := range tooMany {
		tooMany[i] = ent("E"+strings.Repeat("x", i), 1)
	}
	big := make([]EnvEntry, 9)
	for i := range big {
		big[i] = ent(string(rune('A'+i)), MaxEnvValue)
	}
	inj := func(in EnvInject) []EnvEntry {
		return []EnvEntry{{Name: "K", Sealed: "k:x", HostOnly: true, Inject: &in}}
	}
	for _, tc := range []struct {
		env  []EnvEntry
		want string
	}{
		{tooMany, "at most 64"},
		{big, "env totals"},
		{[]EnvEntry{ent("1A", 1)}, "must match"},
		{[]EnvEntry{ent("B", 1), ent("A", 1)}, "not sorted"},
		{[]EnvEntry{ent("A", 1), ent("A", 1)}, "not sorted"},
		{[]EnvEntry{ent("A", MaxEnvValue+1)}, "over 8192"},
		{[]EnvEntry{{Name: "A", Size: 1}}, "sealed value"},
		{[]EnvEntry{{Name: "A", Sealed: "k:x", Inject: &EnvInject{Hosts: []string{"a"}, Header: "X"}}}, "inject needs guest: false"},
		{inj(EnvInject{Header: "X"}), "1 to 8 hosts"},
		{inj(EnvInject{Hosts: []string{"a"}}), "exactly one of header or query"},
		{inj(EnvInject{Hosts: []string{"a"}, Header: "X", Query: "q"}), "exactly one of header or query"},
		{inj(EnvInject{Hosts: []string{"a"}, Header: "X", Body: true}), "body needs query"},
		{inj(EnvInject{Hosts: []string{"a"}, Query: "q"}), "needs a placeholder"},
		{inj(EnvInject{Hosts: []string{"a"}, Query: "q", Placeholder: " p"}), "surrounding space"},
		{inj(EnvInject{Hosts: []string{"a"}, Header: "Host"}), `header "Host" cannot be injected`},
		{inj(EnvInject{Hosts: []string{"a"}, Header: "Transfer-Encoding"}), "cannot be injected"},
		{inj(EnvInject{Hosts: []string{"*"}, Header: "X"}), "too wide"},
		{inj(EnvInject{Hosts: []string{"A.com"}, Header: "X"}), "lowercase"},
		{inj(EnvInject{Hosts: []string{"a.com:443"}, Header: "X"}), "port"},
		{inj(EnvInject{Hosts: []string{"a.com", "a.com"}, Header: "X"}), "twice"},
	} {
		err := ValidEnv(tc.env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidEnv = %v, want %q", err, tc.want)
		}
	}
	for _, tc := range []struct {
		v  string
		ok bool
	}{{"plain", true}, {"tab\there", true}, {"nl\n", false}, {"\x00", false}, {strings.Repeat("x", MaxEnvValue), true}, {strings.Repeat("x", MaxEnvValue+1), false}} {
		if err := ValidEnvValue("N", tc.v); (err == nil) != tc.ok {
			t.Errorf("ValidEnvValue(%.20q) = %v", tc.v, err)
		}
	}
}
