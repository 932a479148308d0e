package proxy

import (
	"strings"

	"github.com/sbxlog/sbxlog/executors/egressmeter"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// Reasons the proxy adds to the policy's (egress.Reason*: no_policy,
// no_rule, bad_port, intercept, internal, unreachable), for counters and
// the meter.
const (
	ReasonNoSocks    egress.Reason = "no_socks"    // SOCKS5 on a sandbox whose policy does not opt in
	ReasonBadRequest egress.Reason = "bad_request" // not a proxy request (relative URI, bad authority)
	ReasonEcho       egress.Reason = "secret_echo" // TRACE or TRACK with a secret or credential to inject: its echo would hand it to the guest
)

// echoes reports whether method is one whose answer echoes the request
// back (TRACE, and IIS's TRACK), headers included. HTTP methods are
// case-sensitive, but servers are lenient, so the match is not.
func echoes(method string) bool {
	return strings.EqualFold(method, "TRACE") || strings.EqualFold(method, "TRACK")
}

// Policies is what the proxy asks of the node's egress state, per request
// or tunnel, so a change applies to the next one; the decisions themselves
// are fsm/egress's (Decide, DecideTunnel, DecideInner) over the effective
// policy read at that moment. projections/egressview.View implements it.
// Implementations must be safe for concurrent use and cheap (no I/O):
// every call runs on the data path.
type Policies interface {
	// SandboxOfVM is the live sandbox VM vm serves (none for a warm VM).
	SandboxOfVM(vm string) (sandbox string, ok bool)
	// Policy is sandbox's effective policy now (false: none, which denies
	// everything).
	Policy(sandbox string) (egress.Effective, bool)
	// SecretsFor maps each registry secret with a value for sandbox to
	// that value (the claim's host-only entry, else the node's).
	SecretsFor(sandbox string) (map[string]string, error)
	// SecretHeader is the header a registry secret is set as.
	SecretHeader(name string) (header string, ok bool)
	// Credentials are sandbox's claim credentials (host-only env entries
	// with an inject spec), values opened.
	Credentials(sandbox string) ([]egress.Credential, error)
}

// Meter receives the proxy's accounting: every decision, and the bytes
// each sandbox moved, aggregated by the implementation.
// executors/egressmeter.Meter implements it.
type Meter interface {
	// Decision records one decision; door is one of egressmeter's Door*.
	Decision(sandbox, door string, d egress.Decision)
	// Transfer adds payload bytes: tx guest to destination, rx back.
	Transfer(sandbox string, tx, rx int64)
	// Close: the sandbox's accounting ended (its VM's doors closed and the
	// VM serves it no more); its last record is due.
	Close(sandbox string)
}

// Door names, as Meter.Decision gets them.
const (
	doorHTTP    = egressmeter.DoorHTTP
	doorConnect = egressmeter.DoorConnect
	doorSocks   = egressmeter.DoorSocks
	doorInner   = egressmeter.DoorInner
)

// DenyAll is the Policies of a node without an egress policy source: no
// VM serves a sandbox, so every request is refused (403, no_policy).
type DenyAll struct{}

func (DenyAll) SandboxOfVM(string) (string, bool)               { return "", false }
func (DenyAll) Policy(string) (egress.Effective, bool)          { return egress.Effective{}, false }
func (DenyAll) SecretsFor(string) (map[string]string, error)    { return nil, nil }
func (DenyAll) SecretHeader(string) (string, bool)              { return "", false }
func (DenyAll) Credentials(string) ([]egress.Credential, error) { return nil, nil }

type noMeter struct{}

func (noMeter) Decision(string, string, egress.Decision) {}
func (noMeter) Transfer(string, int64, int64)            {}
func (noMeter) Close(string)                             {}

// policy is sandbox's effective policy now; the zero Effective (no
// policy: every decision no_policy) for a VM that serves no sandbox.
func (s *Server) policy(sandbox string, known bool) egress.Effective {
	if !known {
		return egress.Effective{}
	}
	e, _ := s.pol.Policy(sandbox)
	return e
}

// secret returns the header and host-held value of the registry secret
// name for sandbox; ok false: nothing to inject (no value, or one that
// does not open: a lost env key injects nothing rather than garbage).
func (s *Server) secret(sandbox, name string) (header, value string, ok bool) {
	h, ok := s.pol.SecretHeader(name)
	if !ok || h == "" {
		return "", "", false
	}
	vals, err := s.pol.SecretsFor(sandbox)
	if err != nil {
		s.log.Warn().Err(err).Str("sandbox", sandbox).Str("secret", name).Msg("secret not injected")
		return "", "", false
	}
	v := vals[name]
	return h, v, v != ""
}

// credentials returns sandbox's claim credentials that cover host.
func (s *Server) credentials(sandbox, host string) []egress.Credential {
	cs, err := s.pol.Credentials(sandbox)
	if err != nil {
		s.log.Warn().Err(err).Str("sandbox", sandbox).Msg("claim credentials not injected")
		return nil
	}
	var out []egress.Credential
	for _, c := range cs {
		if c.Value == "" {
			continue
		}
		for _, h := range c.Inject.Hosts {
			if egress.MatchHost(h, host) {
				out = append(out, c)
				break
			}
		}
	}
	return out
}
