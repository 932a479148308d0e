package egress

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMatchHost(t *testing.T) {
	for _, tc := range []struct {
		pattern, host string
		want          bool
	}{
		{"*", "anything.example", true},
		{"*", "10.0.0.1", true},
		{"*.x.com", "a.x.com", true},
		{"*.x.com", "b.a.x.com", true},
		{"*.x.com", "x.com", false},
		{"*.x.com", "ax.com", false},
		{"*.x.com", "A.X.COM", true},
		{"api.github.com", "API.GitHub.com", true},
		{"api.github.com", "api.github.com.evil", false},
		{"api.github.com", "github.com", false},
		{"127.0.0.1", "127.0.0.1", true},
		{"127.0.0.1", "127.0.0.2", false},
	} {
		if got := MatchHost(tc.pattern, tc.host); got != tc.want {
			t.Errorf("MatchHost(%q, %q) = %v", tc.pattern, tc.host, got)
		}
	}
}

func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		rule, pattern string
		want          bool
	}{
		{"*", "api.x.com", true},
		{"*", "*.x.com", true},
		{"api.x.com", "api.x.com", true},
		{"api.x.com", "*.x.com", false},
		{"*.x.com", "api.x.com", true},
		{"*.x.com", "*.x.com", true},
		{"*.x.com", "*.a.x.com", true},
		{"*.a.x.com", "*.x.com", false},
		{"*.x.com", "x.com", false},
	} {
		if got := Covers(tc.rule, tc.pattern); got != tc.want {
			t.Errorf("Covers(%q, %q) = %v", tc.rule, tc.pattern, got)
		}
	}
}

func TestNormalize(t *testing.T) {
	p := Normalize(Policy{Allow: []Rule{{Host: "API.Example.COM", Methods: []string{"get", "Post"}, Ports: []uint16{}}}})
	r := p.Allow[0]
	if r.Host != "api.example.com" || r.Methods[0] != "GET" || r.Methods[1] != "POST" || r.Ports != nil {
		t.Fatalf("normalized %+v", r)
	}
	if Normalize(Policy{Allow: []Rule{}}).Allow != nil {
		t.Fatal("an empty allow list is not nil")
	}
}

func TestValidate(t *testing.T) {
	ok := func(p Policy, s Scope) {
		t.Helper()
		if err := Validate(Normalize(p), s); err != nil {
			t.Errorf("Validate(%+v) = %v", p, err)
		}
	}
	ok(Policy{}, ScopePool)
	ok(Policy{Allow: []Rule{{Host: "*"}}, Socks5: true}, ScopePool)
	ok(Policy{Allow: []Rule{{Host: "api.github.com", Methods: []string{"GET"}, Ports: []uint16{443}, Secret: "gh", Intercept: InterceptAlways},
		{Host: "*.googleapis.com"}, {Host: "*", Intercept: InterceptInject}}, Socks5: true}, ScopePool)
	ok(Policy{Allow: []Rule{{Host: "::1"}, {Host: "10.0.0.1"}}}, ScopeClass)
	for _, tc := range []struct {
		p     Policy
		scope Scope
		want  string
	}{
		{Policy{Allow: []Rule{{Host: ""}}}, ScopePool, "allow[0]: host must not be empty"},
		{Policy{Allow: []Rule{{Host: "a"}, {Host: "*."}}}, ScopePool, `allow[1]: host "*." needs a domain after the wildcard`},
		{Policy{Allow: []Rule{{Host: "*", Intercept: InterceptInject, Secret: "gh"}}}, ScopePool, `allow[0]: an intercept "inject" rule splices for claims without a credential, so it must not carry a secret`},
		{Policy{Allow: []Rule{{Host: "a", Ports: []uint16{0}}}}, ScopePool, "allow[0]: port 0 is not a destination"},
		{Policy{Allow: []Rule{{Host: "a", Ports: []uint16{443, 80, 443}}}}, ScopePool, "allow[0]: port 443 repeated"},
		{Policy{Allow: []Rule{{Host: "a", Methods: []string{"GET"}}}, Socks5: true}, ScopePool, "socks5 needs a rule that admits CONNECT"},
		{Policy{Allow: []Rule{{Host: "a", Intercept: InterceptAlways}}, Socks5: true}, ScopePool, "socks5 needs a rule that admits CONNECT"},
		{Policy{Allow: []Rule{{Host: "a", Intercept: InterceptAlways}}}, ScopeClass, "allow[0]: intercept may only be set on a pool rule"},
		{Policy{Allow: []Rule{{Host: "a", Intercept: InterceptInject}}}, ScopeClass, "allow[0]: intercept may only be set on a pool rule"},
		{Policy{Allow: []Rule{{Host: "a*.x.com"}}}, ScopePool, "a wildcard is"},
		{Policy{Allow: []Rule{{Host: "http://x.com"}}}, ScopePool, "without scheme, port or path"},
		{Policy{Allow: []Rule{{Host: "x..com"}}}, ScopePool, "empty label"},
		{Policy{Allow: []Rule{{Host: "a", Methods: []string{"GE T"}}}}, ScopePool, "is not an HTTP method"},
		{Policy{Allow: []Rule{{Host: "a", Secret: "two words"}}}, ScopePool, "printable"},
		{Policy{Allow: make([]Rule, MaxRules+1)}, ScopePool, "rules, at most"},
	} {
		err := Validate(Normalize(tc.p), tc.scope)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.p, err, tc.want)
		}
	}
}

func TestInterceptJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Intercept
	}{{"false", InterceptOff}, {"true", InterceptAlways}, {`"inject"`, InterceptInject}} {
		var r Rule
		if err := json.Unmarshal([]byte(`{"host":"a","intercept":`+tc.in+`}`), &r); err != nil || r.Intercept != tc.want {
			t.Errorf("%s: %v %v", tc.in, r.Intercept, err)
		}
		b, _ := json.Marshal(r)
		if tc.want == InterceptOff {
			if strings.Contains(string(b), "intercept") {
				t.Errorf("off is written: %s", b)
			}
		} else if !strings.Contains(string(b), `"intercept":`+tc.in) {
			t.Errorf("%s written as %s", tc.in, b)
		}
	}
	for _, bad := range []string{`"yes"`, `1`, `null`, `"true"`} {
		var r Rule
		err := json.Unmarshal([]byte(`{"host":"a","intercept":`+bad+`}`), &r)
		if err == nil || !strings.Contains(err.Error(), `intercept must be true, false or "inject", got `+bad) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func TestSecretsAndIntercepts(t *testing.T) {
	p := Policy{Allow: []Rule{{Host: "a", Secret: "z"}, {Host: "b", Secret: "a"}, {Host: "c", Secret: "z"}, {Host: "d"}}}
	if got := Secrets(p); strings.Join(got, ",") != "a,z" {
		t.Fatalf("Secrets = %v", got)
	}
	if Intercepts(p) || !Intercepts(Policy{Allow: []Rule{{Host: "a", Intercept: InterceptInject}}}) {
		t.Fatal("Intercepts")
	}
	a, b := Normalize(p), Normalize(p)
	if !Equal(&a, &b) || Equal(&a, nil) || !Equal(nil, nil) {
		t.Fatal("Equal")
	}
	b.Allow[0].Ports = []uint16{1}
	if Equal(&a, &b) {
		t.Fatal("Equal ignores ports")
	}
}

func TestValidateSecrets(t *testing.T) {
	if err := ValidateSecrets([]SecretSpec{{Name: "gh", Header: "Authorization", ValueEnv: "GH_TOKEN"}, {Name: "GW_KEY", Header: "X-Api-Key"}}); err != nil {
		t.Fatal(err)
	}
	if (SecretSpec{Name: "gh", ValueEnv: "GH_TOKEN"}).EnvName() != "GH_TOKEN" || (SecretSpec{Name: "GW_KEY"}).EnvName() != "GW_KEY" {
		t.Fatal("EnvName")
	}
	for _, tc := range []struct {
		specs []SecretSpec
		want  string
	}{
		{[]SecretSpec{{Header: "X"}}, "secret name must not be empty"},
		{[]SecretSpec{{Name: "gw-key", Header: "X"}}, "has no value_env"},
		{[]SecretSpec{{Name: "a", Header: "X", ValueEnv: "1X"}}, "value_env"},
		{[]SecretSpec{{Name: "A", Header: "X"}, {Name: "A", Header: "Y"}}, "duplicate secret name"},
		{[]SecretSpec{{Name: "A", Header: "Host"}}, "cannot be injected"},
		{[]SecretSpec{{Name: "A", Header: "Bad Header"}}, "not a header name"},
	} {
		if err := ValidateSecrets(tc.specs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateSecrets(%+v) = %v, want %q", tc.specs, err, tc.want)
		}
	}
}
