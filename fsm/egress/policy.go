// Package egress is the guarded egress's policy model, as the old daemon
// had it, and nothing else: pure functions over policies (no I/O, no
// clock, no network types), shared by the state machine, the API and the
// proxy.
//
// The contract:
//
//   - A Policy is an allow list of Rules (host exact, "*.suffix" or "*";
//     methods and ports, empty meaning any; a secret's name; an
//     interception mode) plus the SOCKS5 opt-in. Normalize puts one in its
//     canonical form (hosts lowercase, methods uppercase, empty lists nil)
//     and Validate checks it with the old daemon's texts; a class's
//     policy may not intercept (Scope).
//   - Default deny: a request no rule admits is denied; an empty allow
//     list denies everything.
//   - Effective is a sandbox's policy: the pool's, the pool's composed
//     with the tenant's egress class, or a class standing alone (Resolve
//     says which, from the claim's pinned facts). Composition is per
//     request: each layer must allow with its own first matching rule,
//     and the pool's rule (its secret) is the one returned. It is never a
//     precomputed intersection of rule sets.
//   - Decide, DecideTunnel and DecideInner are the proxy's three
//     questions (a plain request; a CONNECT or SOCKS5 tunnel; a request
//     inside an intercepted tunnel), each answering allow or deny, the
//     rule, the secret to inject and, for a tunnel, whether to intercept.
//
// Internal destinations (loopback, private ranges...) are not this
// package's: the proxy checks the address it connects to after the
// policy allowed the name (executors/netguard).
package egress

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Rule, Policy and Intercept are the log's types: a policy is recorded
// as it is evaluated.
type (
	Rule      = event.EgressRule
	Policy    = event.EgressPolicy
	Intercept = event.Intercept
)

// Interception modes.
const (
	InterceptOff    = event.InterceptOff
	InterceptInject = event.InterceptInject
	InterceptAlways = event.InterceptAlways
)

// Scope says whose policy is validated.
type Scope uint8

// Scopes: a pool's policy may intercept; an egress class's may not (the
// old daemon's rule: only the pool decides what its guests trust).
const (
	ScopePool Scope = iota + 1
	ScopeClass
)

// Bounds on a policy, so one command cannot grow the log or the state
// without bound.
const (
	MaxRules      = 256
	MaxMethods    = 16
	MaxPorts      = 64
	MaxHost       = 253
	MaxSecretName = 128
)

// MethodConnect is the method a tunnel (CONNECT, SOCKS5) is matched with.
const MethodConnect = "CONNECT"

// Normalize returns p in canonical form: hosts lowercase, methods
// uppercase, empty lists nil. It copies; p is not changed.
func Normalize(p Policy) Policy {
	out := Policy{Socks5: p.Socks5}
	if len(p.Allow) > 0 {
		out.Allow = make([]Rule, len(p.Allow))
		for i, r := range p.Allow {
			r.Host = strings.ToLower(r.Host)
			if len(r.Methods) == 0 {
				r.Methods = nil
			} else {
				ms := make([]string, len(r.Methods))
				for j, m := range r.Methods {
					ms[j] = strings.ToUpper(m)
				}
				r.Methods = ms
			}
			if len(r.Ports) == 0 {
				r.Ports = nil
			} else {
				r.Ports = slices.Clone(r.Ports)
			}
			out.Allow[i] = r
		}
	}
	return out
}

// Clone returns a deep copy of p.
func Clone(p *Policy) *Policy {
	if p == nil {
		return nil
	}
	c := Normalize(*p)
	return &c
}

// Equal reports whether two policies are the same (nil only equals nil).
func Equal(a, b *Policy) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Socks5 == b.Socks5 && slices.EqualFunc(a.Allow, b.Allow, func(x, y Rule) bool {
		return x.Host == y.Host && x.Secret == y.Secret && x.Intercept == y.Intercept &&
			slices.Equal(x.Methods, y.Methods) && slices.Equal(x.Ports, y.Ports)
	})
}

// Validate checks a normalized policy. The texts are the old daemon's
// (allow[i]: ...), which a caller prefixes with whose policy it is.
func Validate(p Policy, scope Scope) error {
	if len(p.Allow) > MaxRules {
		return fmt.Errorf("%d rules, at most %d", len(p.Allow), MaxRules)
	}
	for i, r := range p.Allow {
		if err := validRule(r, scope); err != nil {
			return fmt.Errorf("allow[%d]: %w", i, err)
		}
	}
	if p.Socks5 && !slices.ContainsFunc(p.Allow, admitsTunnel) {
		return fmt.Errorf("socks5 needs a rule that admits CONNECT")
	}
	return nil
}

func validRule(r Rule, scope Scope) error {
	switch {
	case r.Host == "":
		return fmt.Errorf("host must not be empty")
	case r.Host == "*.":
		return fmt.Errorf("host %q needs a domain after the wildcard", r.Host)
	case len(r.Host) > MaxHost:
		return fmt.Errorf("host is over %d bytes", MaxHost)
	}
	if err := validHost(r.Host); err != nil {
		return err
	}
	if r.Intercept > InterceptAlways {
		return fmt.Errorf("intercept must be true, false or \"inject\", got %d", uint8(r.Intercept))
	}
	if scope == ScopeClass && r.Intercept != InterceptOff {
		return fmt.Errorf("intercept may only be set on a pool rule")
	}
	if r.Intercept == InterceptInject && r.Secret != "" {
		return fmt.Errorf("an intercept \"inject\" rule splices for claims without a credential, so it must not carry a secret")
	}
	if len(r.Methods) > MaxMethods {
		return fmt.Errorf("%d methods, at most %d", len(r.Methods), MaxMethods)
	}
	for _, m := range r.Methods {
		if !isToken(m) {
			return fmt.Errorf("method %q is not an HTTP method", m)
		}
	}
	if len(r.Ports) > MaxPorts {
		return fmt.Errorf("%d ports, at most %d", len(r.Ports), MaxPorts)
	}
	for i, port := range r.Ports {
		if port == 0 {
			return fmt.Errorf("port 0 is not a destination")
		}
		if slices.Contains(r.Ports[:i], port) {
			return fmt.Errorf("port %d repeated", port)
		}
	}
	if len(r.Secret) > MaxSecretName || strings.ContainsFunc(r.Secret, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		return fmt.Errorf("secret %q: a name of at most %d printable bytes", r.Secret, MaxSecretName)
	}
	return nil
}

// validHost accepts "*", "*.suffix" and names or IP literals: no
// whitespace, no port or path, a wildcard only as the leading label.
func validHost(h string) error {
	if h == "*" {
		return nil
	}
	name := strings.TrimPrefix(h, "*.")
	if strings.Contains(name, "*") {
		return fmt.Errorf("host %q: a wildcard is \"*\" or a leading \"*.\"", h)
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte("/\\?#@[]", c) >= 0 {
			return fmt.Errorf("host %q must be a name or an IP literal, without scheme, port or path", h)
		}
	}
	if strings.HasPrefix(name, ".") || strings.Contains(name, "..") {
		return fmt.Errorf("host %q has an empty label", h)
	}
	return nil
}

// isToken reports whether m is an RFC 9110 token (an HTTP method).
func isToken(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for _, c := range []byte(m) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// Secrets returns the secret names p's rules use, sorted, once each.
func Secrets(p Policy) []string {
	var out []string
	for _, r := range p.Allow {
		if r.Secret != "" && !slices.Contains(out, r.Secret) {
			out = append(out, r.Secret)
		}
	}
	slices.Sort(out)
	return out
}

// Intercepts reports whether any rule of p intercepts (true or "inject"):
// the proxy needs the node's CA for it.
func Intercepts(p Policy) bool {
	return slices.ContainsFunc(p.Allow, func(r Rule) bool { return r.Intercept != InterceptOff })
}

// admitsTunnel reports whether r can admit a CONNECT: it is not an
// always-intercept rule, and its methods are any or include CONNECT.
func admitsTunnel(r Rule) bool {
	return r.Intercept != InterceptAlways && (len(r.Methods) == 0 || slices.Contains(r.Methods, MethodConnect))
}

// MatchHost reports whether host matches pattern: "*" matches every
// host, "*.x.com" every host ending in ".x.com" (not x.com itself),
// anything else only itself; case-insensitively.
func MatchHost(pattern, host string) bool {
	host = strings.ToLower(host)
	switch {
	case pattern == "*":
		return true
	case strings.HasPrefix(pattern, "*."):
		return strings.HasSuffix(host, pattern[1:])
	}
	return strings.EqualFold(pattern, host)
}

// Covers reports whether rule host pattern covers the host pattern p: an
// exact p must be matched by it; a wildcard p ("*.sfx") only by "*" or a
// wildcard whose suffix ends .sfx.
func Covers(rule, p string) bool {
	if !strings.HasPrefix(p, "*.") {
		return MatchHost(rule, p)
	}
	switch {
	case rule == "*":
		return true
	case strings.HasPrefix(rule, "*."):
		return strings.HasSuffix(strings.ToLower(p[1:]), rule[1:])
	}
	return false
}

func methodOK(r Rule, method string) bool {
	if len(r.Methods) == 0 {
		return true
	}
	for _, m := range r.Methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

func portOK(r Rule, port uint16) bool { return len(r.Ports) == 0 || slices.Contains(r.Ports, port) }

// eval is Eval of one policy: the first rule matching host, method and
// port, skipping always-intercept rules (admitting one here would send
// its secret over a path the proxy does not terminate).
func eval(p *Policy, host, method string, port uint16) (Rule, bool) {
	for _, r := range p.Allow {
		if r.Intercept != InterceptAlways && MatchHost(r.Host, host) && methodOK(r, method) && portOK(r, port) {
			return r, true
		}
	}
	return Rule{}, false
}

// evalHost is EvalHost of one policy: among the rules matching host and
// port, the one with the highest interception mode, the first on a tie;
// an always-intercept rule answers at once.
func evalHost(p *Policy, host string, port uint16) (Rule, bool) {
	var best Rule
	found := false
	for _, r := range p.Allow {
		if !MatchHost(r.Host, host) || !portOK(r, port) {
			continue
		}
		if r.Intercept == InterceptAlways {
			return r, true
		}
		if !found || r.Intercept > best.Intercept {
			best, found = r, true
		}
	}
	return best, found
}

// evalInner is EvalInner of one policy: the first rule of interception
// mode mode matching host, method and port, so a plain rule neither
// rescues nor shadows an intercept rule inside the tunnel.
func evalInner(p *Policy, host, method string, port uint16, mode Intercept) (Rule, bool) {
	for _, r := range p.Allow {
		if r.Intercept == mode && MatchHost(r.Host, host) && methodOK(r, method) && portOK(r, port) {
			return r, true
		}
	}
	return Rule{}, false
}
