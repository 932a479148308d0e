package event

import (
	"bytes"
	"fmt"
)

// Guarded egress payloads. A policy is the old daemon's shape: an allow
// list of rules (host exact, "*.suffix" or "*"; methods and ports, empty
// meaning any; the name of a secret to inject, never a value; the HTTPS
// interception mode) and the SOCKS5 opt-in. Policies carry no secret:
// secret values live in the process environment of the node (named by
// its config) and in claims' env, whose values are recorded sealed only
// (EnvEntry.Sealed: AES-GCM under the node's env key, which is never in
// the log).

// Intercept is a rule's HTTPS interception mode. Its JSON is the old
// daemon's: false (off), true (always) or "inject" (only for a claim that
// holds a credential for the host).
type Intercept uint8

// Interception modes, ordered: a higher mode wins EvalHost.
const (
	InterceptOff    Intercept = 0
	InterceptInject Intercept = 1
	InterceptAlways Intercept = 2
)

// String returns the mode's JSON form without quotes.
func (m Intercept) String() string {
	switch m {
	case InterceptOff:
		return "false"
	case InterceptInject:
		return "inject"
	case InterceptAlways:
		return "true"
	}
	return fmt.Sprintf("intercept(%d)", uint8(m))
}

// MarshalJSON writes false, true or "inject".
func (m Intercept) MarshalJSON() ([]byte, error) {
	switch m {
	case InterceptOff:
		return []byte("false"), nil
	case InterceptInject:
		return []byte(`"inject"`), nil
	case InterceptAlways:
		return []byte("true"), nil
	}
	return nil, fmt.Errorf("intercept mode %d is not false, true or \"inject\"", uint8(m))
}

// UnmarshalJSON reads false, true or "inject"; anything else is the old
// daemon's error.
func (m *Intercept) UnmarshalJSON(b []byte) error {
	switch string(bytes.TrimSpace(b)) {
	case "false":
		*m = InterceptOff
	case "true":
		*m = InterceptAlways
	case `"inject"`:
		*m = InterceptInject
	default:
		return fmt.Errorf("intercept must be true, false or \"inject\", got %s", bytes.TrimSpace(b))
	}
	return nil
}

// EgressRule is one entry of a policy's allow list.
type EgressRule struct {
	// Host is an exact name (or IP literal), "*.suffix" (any name ending
	// in .suffix, not suffix itself) or "*"; stored lowercase.
	Host string `json:"host"`
	// Methods (uppercase) and Ports restrict the rule; empty means any.
	Methods []string `json:"methods,omitempty"`
	Ports   []uint16 `json:"ports,omitempty"`
	// Secret names a secret of the node's registry whose value the proxy
	// sets as its header on the requests this rule admits.
	Secret    string    `json:"secret,omitempty"`
	Intercept Intercept `json:"intercept,omitempty"`
}

// EgressPolicy is a pool's or an egress class's policy. An empty allow
// list is valid and denies everything.
type EgressPolicy struct {
	Allow []EgressRule `json:"allow"`
	// Socks5 opts the SOCKS5 door in.
	Socks5 bool `json:"socks5,omitempty"`
}

// EgressPoolSet sets the egress policy of pool Key (its spec is the last
// PoolsConfigured's); a nil Policy removes it. Decided with the
// PoolsConfigured that names the pool, after it.
type EgressPoolSet struct {
	Key    PoolKey       `json:"key"`
	Policy *EgressPolicy `json:"policy,omitempty"`
}

// EgressClassPut creates or replaces egress class Name (a named policy
// tenants point at with their egress_class). Config marks one proposed
// from sandboxd's config rather than the API, as TenantPut's.
type EgressClassPut struct {
	Name   string       `json:"name"`
	Policy EgressPolicy `json:"policy"`
	Config bool         `json:"config,omitempty"`
}

// EgressClassRemoved removes egress class Name. Config as in
// EgressClassPut.
type EgressClassRemoved struct {
	Name   string `json:"name"`
	Config bool   `json:"config,omitempty"`
}

// EnvInject is a host-only env entry's claim credential: the proxy puts
// the value into the requests to Hosts it intercepts, as header Header or
// in place of Placeholder in query parameter Query (and in the form or
// JSON body when Body).
type EnvInject struct {
	Hosts       []string `json:"hosts"`
	Header      string   `json:"header,omitempty"`
	Query       string   `json:"query,omitempty"`
	Body        bool     `json:"body,omitempty"`
	Placeholder string   `json:"placeholder,omitempty"`
}

// EnvEntry is one env entry of a claim. Sealed is the value sealed under
// the node's env key ("<key id>:<base64 nonce+ciphertext>", bound to the
// claim and the name); Size its length in the clear, which the limits
// count. HostOnly entries (the old guest: false) never enter the guest.
type EnvEntry struct {
	Name     string     `json:"name"`
	Sealed   string     `json:"sealed"`
	Size     int        `json:"size"`
	HostOnly bool       `json:"host_only,omitempty"`
	Inject   *EnvInject `json:"inject,omitempty"`
}

// ClaimEnvChanged changes a live claim's env: with Replace the env becomes
// Set; otherwise each entry of Set replaces the one of its name (or is
// added) and each name of Remove is removed. Set is sorted by name,
// Remove too.
type ClaimEnvChanged struct {
	Claim   string     `json:"claim"`
	Replace bool       `json:"replace,omitempty"`
	Set     []EnvEntry `json:"set,omitempty"`
	Remove  []string   `json:"remove,omitempty"`
}

// EgressUsage is what a sandbox's egress proxy did over [FromNS, ToNS):
// payload bytes guest to destination (Tx) and back (Rx), decisions that
// allowed and that denied. One per sandbox per flush interval, and a
// Final one when its proxy closed; never one per request. Key and Tenant
// are the claim's, when the state still knew it.
type EgressUsage struct {
	Claim   string   `json:"claim"`
	Key     *PoolKey `json:"key,omitempty"`
	Tenant  string   `json:"tenant,omitempty"`
	FromNS  int64    `json:"from_ns"`
	ToNS    int64    `json:"to_ns"`
	Tx      int64    `json:"tx_bytes"`
	Rx      int64    `json:"rx_bytes"`
	Allowed int64    `json:"allowed,omitempty"`
	Denied  int64    `json:"denied,omitempty"`
	Final   bool     `json:"final,omitempty"`
}

func (EgressPoolSet) EventType() Type      { return TypeEgressPoolSet }
func (EgressClassPut) EventType() Type     { return TypeEgressClassPut }
func (EgressClassRemoved) EventType() Type { return TypeEgressClassRemoved }
func (ClaimEnvChanged) EventType() Type    { return TypeClaimEnvChanged }
func (EgressUsage) EventType() Type        { return TypeEgressUsage }

func init() {
	registerJSON[EgressPoolSet](1)
	registerJSON[EgressClassPut](1)
	registerJSON[EgressClassRemoved](1)
	registerJSON[ClaimEnvChanged](1)
	registerJSON[EgressUsage](1)
}
