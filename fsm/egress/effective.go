package egress

import "slices"

// Effective is one sandbox's policy: Base alone (a pool's policy for a
// root claim, or a tenant's class standing alone on a key without a
// pool), or Base (the pool's) composed with Tenant (the tenant's class).
// The policies it points at are never changed in place: a new policy
// replaces the old one in the state, so an Effective read once may be
// used without a lock until the caller looks it up again.
type Effective struct {
	Base   *Policy
	Tenant *Policy
}

// Claim is what Resolve needs to know of a claim, as the state pinned it
// when the claim was made (the tenant's class, whether its key had a
// pool) and as it is now (the policies those name).
type Claim struct {
	// NoEgress: the claim asked for no egress ("egress": false).
	NoEgress bool
	// Tenant is the claim's tenant ("" for a root claim).
	Tenant string
	// Unpooled: the key had no configured pool when the claim was made.
	Unpooled bool
	// Pool is the policy of the claim's pool (nil: none).
	Pool *Policy
	// Class is the policy of the egress class the claim pinned (nil: no
	// class, or no class of that name any more).
	Class *Policy
}

// Resolve returns a claim's effective policy, the old daemon's table; ok
// false means the claim has none (no door, and every request denied):
//
//	egress false                           none
//	pool policy, root claim                the pool's, whole
//	pool policy, tenant with a class       pool composed with class
//	pool policy, tenant without a class    none
//	no pool policy, key pooled at claim    none
//	no pool policy, unpooled, class        the class alone
//	no pool policy, unpooled, root         none
func Resolve(c Claim) (Effective, bool) {
	switch {
	case c.NoEgress:
		return Effective{}, false
	case c.Pool != nil && c.Tenant == "":
		return Effective{Base: c.Pool}, true
	case c.Pool != nil && c.Class != nil:
		return Effective{Base: c.Pool, Tenant: c.Class}, true
	case c.Pool != nil:
		return Effective{}, false
	case c.Unpooled && c.Tenant != "" && c.Class != nil:
		return Effective{Base: c.Class}, true
	}
	return Effective{}, false
}

// Valid reports whether e has a policy (the zero Effective has none and
// denies everything).
func (e Effective) Valid() bool { return e.Base != nil }

// Eval answers a plain request (forward door, absolute https, a tunnel as
// method CONNECT): every layer must admit it with its own first matching
// rule; the rule returned is the base's (the pool rule wins a double
// allow, so only its secret is injected).
func (e Effective) Eval(host, method string, port uint16) (Rule, bool) {
	return e.compose(
		func(p *Policy) (Rule, bool) { return eval(p, host, method, port) },
		func(p *Policy) (Rule, bool) { return eval(p, host, method, port) })
}

// EvalHost answers whether a CONNECT to host:port is admitted by host and
// port alone and with which rule (the base's), which says whether it is
// intercepted.
func (e Effective) EvalHost(host string, port uint16) (Rule, bool) {
	at := func(p *Policy) (Rule, bool) { return evalHost(p, host, port) }
	return e.compose(at, at)
}

// EvalInner answers a request inside a tunnel intercepted with mode: the
// base's rules of that mode, and the tenant's class as for a plain
// request (a class cannot intercept).
func (e Effective) EvalInner(host, method string, port uint16, mode Intercept) (Rule, bool) {
	return e.compose(
		func(p *Policy) (Rule, bool) { return evalInner(p, host, method, port, mode) },
		func(p *Policy) (Rule, bool) { return eval(p, host, method, port) })
}

// compose asks the base, then the tenant's class when there is one: both
// must admit, and the base's rule is the answer.
func (e Effective) compose(base, tenant func(*Policy) (Rule, bool)) (Rule, bool) {
	if e.Base == nil {
		return Rule{}, false
	}
	r, ok := base(e.Base)
	if !ok {
		return Rule{}, false
	}
	if e.Tenant != nil {
		if _, ok := tenant(e.Tenant); !ok {
			return Rule{}, false
		}
	}
	return r, true
}

// ServesSocks reports whether the SOCKS5 door is opened: the base's
// opt-in alone (the tenant's rules gate every tunnel through Eval).
func (e Effective) ServesSocks() bool { return e.Base != nil && e.Base.Socks5 }

// Intercepts reports whether any base rule intercepts: the sandbox's
// proxy needs the node's CA.
func (e Effective) Intercepts() bool { return e.Base != nil && Intercepts(*e.Base) }

// InterceptsHost reports whether the host pattern (a name or "*.sfx") is
// intercepted for this sandbox: a base rule that intercepts (true or
// "inject") covers it and, when composed, some tenant rule covers it
// too. Methods and ports are not looked at. A claim credential may only
// name such hosts.
func (e Effective) InterceptsHost(pattern string) bool {
	if e.Base == nil {
		return false
	}
	if !slices.ContainsFunc(e.Base.Allow, func(r Rule) bool { return r.Intercept != InterceptOff && Covers(r.Host, pattern) }) {
		return false
	}
	return e.Tenant == nil || slices.ContainsFunc(e.Tenant.Allow, func(r Rule) bool { return Covers(r.Host, pattern) })
}

// Reason says why a decision denied.
type Reason string

// Deny reasons; "" when allowed. They are the proxy's metric labels.
const (
	ReasonNone      Reason = ""
	ReasonNoPolicy  Reason = "no_policy"   // the sandbox has no effective policy
	ReasonNoRule    Reason = "no_rule"     // no rule admits it
	ReasonBadPort   Reason = "bad_port"    // port 0
	ReasonIntercept Reason = "intercept"   // a SOCKS5 tunnel the policy wants intercepted
	ReasonInternal  Reason = "internal"    // the address is internal (the proxy's check)
	ReasonUpstream  Reason = "unreachable" // the dial failed (the proxy's)
)

// Decision is the answer to one request or tunnel.
type Decision struct {
	Allow bool
	// Rule is the admitting rule (the base's) when Allow.
	Rule Rule
	// Secret is the secret to inject: the rule's on a request (forward or
	// inside an intercepted tunnel); empty on a tunnel that is spliced.
	Secret string
	// Intercept is, for a tunnel, the mode to intercept it with
	// (InterceptOff: splice); for a request inside one, the mode it was
	// intercepted with.
	Intercept Intercept
	Reason    Reason
}

func deny(r Reason) Decision { return Decision{Reason: r} }

// Decide answers a plain request: the forward door (plaintext, or an
// absolute https:// URL the proxy re-originates), by host, method and
// port (the URL's, or the scheme's default).
func Decide(e Effective, host, method string, port uint16) Decision {
	switch {
	case !e.Valid():
		return deny(ReasonNoPolicy)
	case port == 0:
		return deny(ReasonBadPort)
	}
	r, ok := e.Eval(host, method, port)
	if !ok {
		return deny(ReasonNoRule)
	}
	return Decision{Allow: true, Rule: r, Secret: r.Secret}
}

// Tunnel describes a tunnel to decide.
type Tunnel struct {
	// CanIntercept: the proxy holds the node's CA (the pool intercepts).
	CanIntercept bool
	// HasCredential: the claim holds a non-empty credential (an inject
	// env entry) for the host, which turns an "inject" rule into
	// interception.
	HasCredential bool
	// Socks: the SOCKS5 door, which has no HTTP to filter: a tunnel the
	// policy wants intercepted is denied, and an "inject" rule is a plain
	// one there.
	Socks bool
}

// DecideTunnel answers a CONNECT or SOCKS5 tunnel to host:port: an
// intercepted one when the proxy can intercept and the host's top rule
// (EvalHost) is intercept true, or "inject" with a credential; otherwise
// a spliced one admitted as method CONNECT (a rule whose methods leave
// CONNECT out denies it, and a rule's secret is not injected into a
// tunnel the proxy does not terminate).
func DecideTunnel(e Effective, host string, port uint16, t Tunnel) Decision {
	switch {
	case !e.Valid():
		return deny(ReasonNoPolicy)
	case port == 0:
		return deny(ReasonBadPort)
	}
	if t.CanIntercept {
		if r, ok := e.EvalHost(host, port); ok {
			mode := r.Intercept
			if mode == InterceptInject && (!t.HasCredential || t.Socks) {
				mode = InterceptOff
			}
			if mode != InterceptOff {
				if t.Socks {
					return deny(ReasonIntercept)
				}
				return Decision{Allow: true, Rule: r, Intercept: mode}
			}
		}
	}
	r, ok := e.Eval(host, MethodConnect, port)
	if !ok {
		return deny(ReasonNoRule)
	}
	return Decision{Allow: true, Rule: r}
}

// DecideInner answers a request inside a tunnel intercepted with mode
// (port is the CONNECT's).
func DecideInner(e Effective, host, method string, port uint16, mode Intercept) Decision {
	switch {
	case !e.Valid():
		return deny(ReasonNoPolicy)
	case port == 0:
		return deny(ReasonBadPort)
	}
	r, ok := e.EvalInner(host, method, port, mode)
	if !ok {
		return deny(ReasonNoRule)
	}
	return Decision{Allow: true, Rule: r, Secret: r.Secret, Intercept: mode}
}
