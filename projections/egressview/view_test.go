package egressview

import (
	"errors"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

type stateEngine struct{ st *fsm.State }

func (e stateEngine) View(fn func(*fsm.State)) { fn(e.st) }

// A registry secret whose value_env is unset refuses the start, as the
// old daemon did; an invalid registry too.
func TestNewChecksTheRegistry(t *testing.T) {
	eng := stateEngine{fsm.New()}
	env := func(k string) string { return map[string]string{"SET": "v"}[k] }
	if _, err := New(eng, Options{Secrets: []egress.SecretSpec{{Name: "a", Header: "X", ValueEnv: "SET"}}, Getenv: env}); err != nil {
		t.Fatal(err)
	}
	_, err := New(eng, Options{Secrets: []egress.SecretSpec{{Name: "a", Header: "X", ValueEnv: "UNSET"}}, Getenv: env})
	if err == nil || !strings.Contains(err.Error(), "env UNSET is unset or empty") {
		t.Fatalf("unset value_env: %v", err)
	}
	if _, err := New(eng, Options{Secrets: []egress.SecretSpec{{Name: "a", Header: "Host"}}}); err == nil {
		t.Fatal("a Host header secret was accepted")
	}
}

// Unknown sandboxes answer ErrUnknownSandbox or false, never a zero value
// that reads as "no secrets".
func TestUnknownSandbox(t *testing.T) {
	v, err := New(stateEngine{fsm.New()}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.SecretsFor("sb_0000000000000001"); !errors.Is(err, ErrUnknownSandbox) {
		t.Fatalf("SecretsFor: %v", err)
	}
	if _, err := v.Credentials("sb_0000000000000001"); !errors.Is(err, ErrUnknownSandbox) {
		t.Fatalf("Credentials: %v", err)
	}
	if _, err := v.GuestEnv("sb_0000000000000001"); !errors.Is(err, ErrUnknownSandbox) {
		t.Fatalf("GuestEnv: %v", err)
	}
	if _, ok := v.Policy("sb_0000000000000001"); ok {
		t.Fatal("Policy of an unknown sandbox")
	}
	if _, ok := v.SandboxOfVM("vm-1"); ok {
		t.Fatal("SandboxOfVM of an unknown VM")
	}
	if _, _, ok := v.SandboxOfTap("sbxabc"); ok {
		t.Fatal("SandboxOfTap of an unknown tap")
	}
}
