package egress

import (
	"fmt"
	"slices"
)

// SecretSpec is one secret of a node's registry (sandboxd's config
// `secrets`): a name rules refer to, the header its value is set as, and
// the process environment variable holding the node's value (empty: the
// secret has no node value, only claims' host-only env entries give it
// one). A registry holds names and headers, never values.
type SecretSpec struct {
	Name     string `json:"name"`
	Header   string `json:"header"`
	ValueEnv string `json:"value_env,omitempty"`
}

// EnvName is the claim env entry that supplies the secret's value for a
// claim (before the node's): value_env, or the secret's own name.
func (s SecretSpec) EnvName() string {
	if s.ValueEnv != "" {
		return s.ValueEnv
	}
	return s.Name
}

// ValidateSecrets checks a registry with the old daemon's rules.
func ValidateSecrets(specs []SecretSpec) error {
	for i, s := range specs {
		switch {
		case s.Name == "":
			return fmt.Errorf("secrets[%d]: secret name must not be empty", i)
		case len(s.Name) > MaxSecretName:
			return fmt.Errorf("secrets[%d]: secret name over %d bytes", i, MaxSecretName)
		case s.ValueEnv == "" && !EnvNameRE.MatchString(s.Name):
			return fmt.Errorf("secrets[%d]: secret %q has no value_env, so its name is a claim env name and must match %s", i, s.Name, EnvNameRE)
		case s.ValueEnv != "" && !EnvNameRE.MatchString(s.ValueEnv):
			return fmt.Errorf("secrets[%d]: value_env %q must match %s", i, s.ValueEnv, EnvNameRE)
		case slices.ContainsFunc(specs[:i], func(o SecretSpec) bool { return o.Name == s.Name }):
			return fmt.Errorf("secrets[%d]: duplicate secret name %q", i, s.Name)
		}
		if err := CheckInjectHeader(s.Header); err != nil {
			return fmt.Errorf("secrets[%d]: secret %q: %w", i, s.Name, err)
		}
	}
	return nil
}

// Credential is a claim credential: a host-only env entry with an inject
// spec, its value opened.
type Credential struct {
	Name   string
	Value  string
	Inject EnvInject
}
