// Package egressview is what a node tells its egress proxy about each
// sandbox, read from the state at the moment it asks: the effective
// policy (so a policy change applies to the next connection), the
// sandbox a VM belongs to, its secrets and claim credentials (opened with
// the node's env key), the env its guest may see, the node's
// internal-address guard and the accounting meter. (SandboxOfTap, the
// sandbox of a tap, is a diagnostic lookup off the data path.)
//
// Contract: every method is safe for concurrent use and takes the
// engine's read lock once (SandboxOfTap walks every VM of the state under
// it). The types are stdlib's, fsm's and fsm/egress's,
// so a proxy package below the projections can declare the interface it
// needs. An ended or unknown sandbox is ErrUnknownSandbox (or false); a
// value that does not open (a lost env key) is envseal.ErrOpen.
package egressview

import (
	"errors"
	"fmt"
	"os"

	"github.com/sbxlog/sbxlog/executors/egressmeter"
	"github.com/sbxlog/sbxlog/executors/netguard"
	"github.com/sbxlog/sbxlog/executors/tap"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/projections/envseal"
)

// ErrUnknownSandbox: no live claim of that id.
var ErrUnknownSandbox = errors.New("egressview: unknown sandbox")

// Engine is what the view reads the state through.
type Engine interface {
	View(fn func(st *fsm.State))
}

// Options configure a View.
type Options struct {
	// Key opens env values (required for secrets and env).
	Key *envseal.Key
	// Secrets is the node's secret registry (sandboxd's config secrets).
	Secrets []egress.SecretSpec
	// Getenv reads the node's values of the registry (default os.Getenv),
	// once, in New.
	Getenv func(string) string
	// Guard is the node's internal-address guard (nil: netguard's fixed
	// table).
	Guard *netguard.Guard
	// Meter is the node's egress accounting.
	Meter *egressmeter.Meter
}

// View answers the proxy's lookups. Create with New.
type View struct {
	eng   Engine
	key   *envseal.Key
	specs []egress.SecretSpec
	byNm  map[string]egress.SecretSpec
	node  map[string]string // secret name -> the node's value
	guard *netguard.Guard
	meter *egressmeter.Meter
}

// New builds a view. A registry secret naming a value_env that is unset
// or empty is an error (the old daemon refused to start with one).
func New(eng Engine, o Options) (*View, error) {
	if err := egress.ValidateSecrets(o.Secrets); err != nil {
		return nil, err
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	v := &View{eng: eng, key: o.Key, specs: o.Secrets, byNm: map[string]egress.SecretSpec{}, node: map[string]string{},
		guard: o.Guard, meter: o.Meter}
	for _, s := range o.Secrets {
		v.byNm[s.Name] = s
		if s.ValueEnv == "" {
			continue
		}
		val := o.Getenv(s.ValueEnv)
		if val == "" {
			return nil, fmt.Errorf("secret %q: env %s is unset or empty", s.Name, s.ValueEnv)
		}
		if err := egress.ValidEnvValue(s.ValueEnv, val); err != nil {
			return nil, fmt.Errorf("secret %q: %w", s.Name, err)
		}
		v.node[s.Name] = val
	}
	return v, nil
}

// Policy returns sandbox's effective policy now; false: it has none
// (deny everything), has ended, or does not exist.
func (v *View) Policy(sandbox string) (egress.Effective, bool) {
	var e egress.Effective
	var ok bool
	v.eng.View(func(st *fsm.State) { e, ok = st.Egress(sandbox) })
	return e, ok
}

// SandboxOfVM returns the live claim VM vm serves.
func (v *View) SandboxOfVM(vm string) (string, bool) {
	var id string
	var ok bool
	v.eng.View(func(st *fsm.State) {
		var c fsm.ClaimRec
		if c, ok = st.ClaimOfVM(vm); ok {
			id = c.ID
		}
	})
	return id, ok
}

// SandboxOfTap returns the live claim (and its VM) whose VM has tap
// (executors/tap.Name of the node's instance and the VM id). It hashes
// every VM id of the state:
// a diagnostic, not for the data path.
func (v *View) SandboxOfTap(name string) (sandbox, vm string, ok bool) {
	v.eng.View(func(st *fsm.State) {
		for _, id := range st.VMIDs() {
			if tap.Name(st.Instance(), id) != name {
				continue
			}
			vm = id
			var c fsm.ClaimRec
			if c, ok = st.ClaimOfVM(id); ok {
				sandbox = c.ID
			}
			return
		}
	})
	return sandbox, vm, ok
}

// SecretHeader returns the header a registry secret is set as.
func (v *View) SecretHeader(name string) (string, bool) {
	s, ok := v.byNm[name]
	return s.Header, ok
}

// Guard returns the node's internal-address guard.
func (v *View) Guard() *netguard.Guard { return v.guard }

// Meter returns the node's egress accounting.
func (v *View) Meter() *egressmeter.Meter { return v.meter }

// env returns a live sandbox's env entries (read-only).
func (v *View) env(sandbox string) ([]egress.EnvEntry, error) {
	var env []egress.EnvEntry
	var ok bool
	v.eng.View(func(st *fsm.State) {
		var c fsm.ClaimRec
		if c, ok = st.Claim(sandbox); ok && c.Status.Live() {
			env = c.Env
		} else {
			ok = false
		}
	})
	if !ok {
		return nil, ErrUnknownSandbox
	}
	return env, nil
}

func (v *View) open(sandbox string, e egress.EnvEntry) (string, error) {
	if v.key == nil {
		return "", fmt.Errorf("%w: this node has no env key", envseal.ErrOpen)
	}
	b, err := v.key.Open(sandbox, e.Name, e.Sealed)
	if err != nil {
		return "", fmt.Errorf("env %s of %s: %w", e.Name, sandbox, err)
	}
	return string(b), nil
}

// SecretsFor returns, for each secret of the registry, its value for
// sandbox: the claim's host-only env entry named the secret's EnvName
// (an entry set to "" suppresses the node's value), else the node's
// value. Secrets without a value are left out. A guest entry never
// feeds a secret.
func (v *View) SecretsFor(sandbox string) (map[string]string, error) {
	env, err := v.env(sandbox)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(v.specs))
	for _, s := range v.specs {
		val := v.node[s.Name]
		for _, e := range env {
			if e.HostOnly && e.Name == s.EnvName() {
				if val, err = v.open(sandbox, e); err != nil {
					return nil, err
				}
				break
			}
		}
		if val != "" {
			out[s.Name] = val
		}
	}
	return out, nil
}

// Credentials returns sandbox's claim credentials (host-only entries with
// an inject spec), in name order, values opened; empty values left out.
func (v *View) Credentials(sandbox string) ([]egress.Credential, error) {
	env, err := v.env(sandbox)
	if err != nil {
		return nil, err
	}
	var out []egress.Credential
	for _, e := range env {
		if !e.HostOnly || e.Inject == nil {
			continue
		}
		val, err := v.open(sandbox, e)
		if err != nil {
			return nil, err
		}
		if val != "" {
			out = append(out, egress.Credential{Name: e.Name, Value: val, Inject: *e.Inject})
		}
	}
	return out, nil
}

// GuestEnv returns the env sandbox's guest may see: its guest entries,
// values opened. Host-only entries never appear.
func (v *View) GuestEnv(sandbox string) (map[string]string, error) {
	env, err := v.env(sandbox)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range env {
		if e.HostOnly {
			continue
		}
		val, err := v.open(sandbox, e)
		if err != nil {
			return nil, err
		}
		out[e.Name] = val
	}
	return out, nil
}
