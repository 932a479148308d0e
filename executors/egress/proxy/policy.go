package proxy

// Intercept is how a tunnel's decision says to treat its TLS.
type Intercept uint8

// Intercept modes, in the policy's order (off, inject, always).
const (
	InterceptOff    Intercept = iota // splice the tunnel
	InterceptInject                  // terminate TLS: the sandbox holds a credential for the host
	InterceptAlways                  // terminate TLS: the rule always intercepts
)

// Decision is the policy's answer for one request or tunnel.
type Decision struct {
	Allow bool
	// Secret is the name of the secret the admitting rule injects ("": none).
	Secret string
	// Intercept, on a tunnel's decision, says whether to terminate its TLS.
	Intercept Intercept
	// Reason labels a refusal (and the proxy's own outcomes: ReasonInternal,
	// ReasonUnreachable, ReasonBadRequest) for counters and the meter.
	Reason string
}

// Reasons the proxy adds to the policy's.
const (
	ReasonNoPolicy    = "no_policy"   // the VM serves no sandbox, or the sandbox has no policy
	ReasonNoSocks     = "no_socks"    // SOCKS5 on a sandbox whose policy does not opt in
	ReasonInternal    = "internal"    // the guard refused the address the name resolved to
	ReasonUnreachable = "unreachable" // the upstream could not be reached
	ReasonBadRequest  = "bad_request" // not a proxy request (relative URI, bad authority)
)

// Tunnel describes a CONNECT or SOCKS5 tunnel to the policy.
type Tunnel struct {
	// CanIntercept: the node has a CA and the sandbox's policy intercepts.
	CanIntercept bool
	// HasCredential: the sandbox holds a claim credential for the host.
	HasCredential bool
	// Socks: the tunnel came through the SOCKS5 door (never intercepted).
	Socks bool
}

// Policies is what the proxy asks of the node's egress policy state, per
// request or tunnel, so a change applies to the next one. Implementations
// must be safe for concurrent use and cheap (no I/O): every call runs on
// the data path.
type Policies interface {
	// SandboxOfVM is the live sandbox VM vm serves (none for a warm VM).
	SandboxOfVM(vm string) (sandbox string, ok bool)
	// Decide is a forward request's decision (plain http, or an absolute
	// https URL the proxy re-originates).
	Decide(sandbox, host, method string, port uint16) Decision
	// DecideTunnel is a CONNECT's or a SOCKS5 tunnel's decision.
	DecideTunnel(sandbox, host string, port uint16, t Tunnel) Decision
	// DecideInner is the decision for a request inside an intercepted
	// tunnel to host:port, intercepted in mode.
	DecideInner(sandbox, host, method string, port uint16, mode Intercept) Decision
	// ServesSocks: the sandbox's policy opts in to the SOCKS5 door.
	ServesSocks(sandbox string) bool
	// Intercepts: the sandbox's policy has a rule that intercepts.
	Intercepts(sandbox string) bool
	// HasCredential: the sandbox holds a claim credential covering host.
	HasCredential(sandbox, host string) bool
	// Secret returns the header and host-held value of the secret name for
	// the sandbox (ok false: nothing to inject).
	Secret(sandbox, name string) (header, value string, ok bool)
}

// Meter receives the proxy's accounting: every decision, and the bytes
// each sandbox moved, aggregated by the implementation.
type Meter interface {
	// Decision records one decision; door is "http", "connect", "socks" or
	// "inner".
	Decision(sandbox, door string, d Decision)
	// Transfer adds payload bytes: tx guest to destination, rx back.
	Transfer(sandbox string, tx, rx int64)
	// Close: the sandbox's doors closed; its last record is due.
	Close(sandbox string)
}

// Door names, as Meter.Decision gets them.
const (
	DoorHTTP    = "http"
	DoorConnect = "connect"
	DoorSocks   = "socks"
	DoorInner   = "inner"
)

// DenyAll is the Policies of a node without an egress policy source: no
// VM serves a sandbox, so every request is refused (403, no_policy).
type DenyAll struct{}

func (DenyAll) SandboxOfVM(string) (string, bool) { return "", false }
func (DenyAll) Decide(string, string, string, uint16) Decision {
	return Decision{Reason: ReasonNoPolicy}
}
func (DenyAll) DecideTunnel(string, string, uint16, Tunnel) Decision {
	return Decision{Reason: ReasonNoPolicy}
}
func (DenyAll) DecideInner(string, string, string, uint16, Intercept) Decision {
	return Decision{Reason: ReasonNoPolicy}
}
func (DenyAll) ServesSocks(string) bool                      { return false }
func (DenyAll) Intercepts(string) bool                       { return false }
func (DenyAll) HasCredential(string, string) bool            { return false }
func (DenyAll) Secret(string, string) (string, string, bool) { return "", "", false }

type noMeter struct{}

func (noMeter) Decision(string, string, Decision) {}
func (noMeter) Transfer(string, int64, int64)     {}
func (noMeter) Close(string)                      {}
