package egress

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// A claim's env, as the old daemon bounded it. Values are checked in the
// clear by whoever seals them (ValidEnvValue); the state sees them sealed
// and checks their recorded sizes.

// EnvEntry and EnvInject are the log's types.
type (
	EnvEntry  = event.EnvEntry
	EnvInject = event.EnvInject
)

// Env limits (the old daemon's).
const (
	MaxEnvEntries     = 64
	MaxEnvValue       = 8 << 10
	MaxEnvTotal       = 64 << 10
	MaxInjectHosts    = 8
	MaxPlaceholder    = 256
	MaxSealedOverhead = 128 // key id, nonce, tag and base64 on top of a value
)

// EnvNameRE is an env entry's name rule.
var EnvNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// ValidEnvValue checks a value in the clear: at most MaxEnvValue bytes,
// no control character but tab.
func ValidEnvValue(name, v string) error {
	if len(v) > MaxEnvValue {
		return fmt.Errorf("env %s: value over %d bytes", name, MaxEnvValue)
	}
	if strings.ContainsFunc(v, func(c rune) bool { return (c < ' ' && c != '\t') || c == 0x7f }) {
		return fmt.Errorf("env %s: value holds a control character", name)
	}
	return nil
}

// ValidEnv checks an env as the state stores it (sorted by name, each
// name once, values sealed): names, sizes, inject specs and the totals.
func ValidEnv(env []EnvEntry) error {
	if len(env) > MaxEnvEntries {
		return fmt.Errorf("env has %d entries, at most %d", len(env), MaxEnvEntries)
	}
	total := 0
	for i, e := range env {
		if !EnvNameRE.MatchString(e.Name) {
			return fmt.Errorf("env name %q must match %s", e.Name, EnvNameRE)
		}
		if i > 0 && env[i-1].Name >= e.Name {
			return fmt.Errorf("env %s: entries not sorted by name, or twice", e.Name)
		}
		if e.Size < 0 || e.Size > MaxEnvValue {
			return fmt.Errorf("env %s: value over %d bytes", e.Name, MaxEnvValue)
		}
		if e.Sealed == "" || len(e.Sealed) > MaxEnvValue*4/3+MaxSealedOverhead {
			return fmt.Errorf("env %s: sealed value of %d bytes", e.Name, len(e.Sealed))
		}
		total += len(e.Name) + e.Size
		if e.Inject != nil {
			if !e.HostOnly {
				return fmt.Errorf("env %s: inject needs guest: false, or the guest holds the value", e.Name)
			}
			n, err := validInject(e.Name, e.Inject)
			if err != nil {
				return err
			}
			total += n
		}
	}
	if total > MaxEnvTotal {
		return fmt.Errorf("env totals %d bytes, at most %d", total, MaxEnvTotal)
	}
	return nil
}

// validInject checks one credential spec and returns its size.
func validInject(name string, in *EnvInject) (int, error) {
	size := len(in.Header) + len(in.Query) + len(in.Placeholder)
	switch {
	case len(in.Hosts) == 0 || len(in.Hosts) > MaxInjectHosts:
		return 0, fmt.Errorf("env %s: inject needs 1 to %d hosts", name, MaxInjectHosts)
	case (in.Header == "") == (in.Query == ""):
		return 0, fmt.Errorf("env %s: inject needs exactly one of header or query", name)
	case in.Body && in.Query == "":
		return 0, fmt.Errorf("env %s: inject body needs query", name)
	case in.Query != "" && in.Placeholder == "":
		return 0, fmt.Errorf("env %s: inject query needs a placeholder", name)
	case len(in.Placeholder) > MaxPlaceholder:
		return 0, fmt.Errorf("env %s: placeholder over %d bytes", name, MaxPlaceholder)
	case in.Placeholder != strings.TrimSpace(in.Placeholder) || !headerValue(in.Placeholder):
		return 0, fmt.Errorf("env %s: placeholder must be a header value without surrounding space", name)
	}
	if in.Header != "" {
		if err := CheckInjectHeader(in.Header); err != nil {
			return 0, fmt.Errorf("env %s: %w", name, err)
		}
	}
	if in.Query != "" && (len(in.Query) > 128 || strings.ContainsAny(in.Query, "&=#? \t")) {
		return 0, fmt.Errorf("env %s: query %q is not a parameter name", name, in.Query)
	}
	for i, h := range in.Hosts {
		size += len(h)
		switch {
		case h == "*":
			return 0, fmt.Errorf("env %s: inject host \"*\" is too wide: name the hosts", name)
		case h != strings.ToLower(h):
			return 0, fmt.Errorf("env %s: inject host %q must be lowercase", name, h)
		case strings.Contains(h, ":"):
			return 0, fmt.Errorf("env %s: inject host %q must not carry a port", name, h)
		case slices.Contains(in.Hosts[:i], h):
			return 0, fmt.Errorf("env %s: inject host %q twice", name, h)
		}
		if err := validHost(h); err != nil || h == "*." || len(h) > MaxHost {
			return 0, fmt.Errorf("env %s: inject host %q is not a name or \"*.suffix\"", name, h)
		}
	}
	return size, nil
}

// CheckInjectHeader refuses headers a proxy must not set: malformed names,
// Host, Content-Length and the hop-by-hop ones.
func CheckInjectHeader(h string) error {
	if !isToken(h) || len(h) > 128 {
		return fmt.Errorf("header %q is not a header name", h)
	}
	switch strings.ToLower(h) {
	case "host", "content-length", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
		"proxy-connection", "te", "trailer", "transfer-encoding", "upgrade":
		return fmt.Errorf("header %q cannot be injected", h)
	}
	return nil
}

func headerValue(v string) bool {
	return !strings.ContainsFunc(v, func(c rune) bool { return (c < ' ' && c != '\t') || c == 0x7f })
}

// InjectGap checks a claim credential against the sandbox's policy, as
// the old daemon did on every write that sets one: each of its hosts must
// be intercepted for the sandbox (InterceptsHost), and no base rule
// covering the host may already inject a secret into the same header
// (secretHeader names a registered secret's header; "" when unknown).
func InjectGap(e Effective, name string, in EnvInject, secretHeader func(secret string) string) error {
	for _, h := range in.Hosts {
		if !e.InterceptsHost(h) {
			return fmt.Errorf("%s: %s is not intercepted", name, h)
		}
		if in.Header == "" || e.Base == nil {
			continue
		}
		for _, r := range e.Base.Allow {
			if r.Secret != "" && Covers(r.Host, h) && secretHeader != nil && strings.EqualFold(secretHeader(r.Secret), in.Header) {
				return fmt.Errorf("%s: the pool's secret already sets %s on %s", name, in.Header, h)
			}
		}
	}
	return nil
}
