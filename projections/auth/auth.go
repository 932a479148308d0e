// Package auth decides who is calling the HTTP API: the root token (from
// config), a tenant token (config holds only its SHA-256) or a sandbox token.
//
// Sandbox tokens are never stored anywhere: a token is HMAC-SHA256(node
// secret, sandbox id, token generation), recomputed on each request. The op log
// records only the generation, so a log (or its replicas, audit and billing
// streams) never carries a credential. Every comparison of a presented secret
// is constant-time.
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// Kind is the kind of caller.
type Kind int

// Caller kinds, from most to least privileged.
const (
	Anonymous Kind = iota
	Root
	Tenant
	Sandbox
)

func (k Kind) String() string {
	return [...]string{"anonymous", "root", "tenant", "sandbox"}[k]
}

// Identity is an authenticated caller.
type Identity struct {
	Kind Kind
	// Tenant names the tenant for Kind == Tenant.
	Tenant string
	// SandboxID is the sandbox the token was minted for (Kind == Sandbox).
	SandboxID string
}

// TenantConfig is a tenant as configured: its name, the hex SHA-256 of its token
// and an optional cap on live claims (0 = none).
type TenantConfig struct {
	Name        string `json:"name"`
	TokenSHA256 string `json:"token_sha256"`
	MaxClaims   int    `json:"max_claims,omitempty"`
}

// Errors returned by New and LoadOrCreateSecret.
var (
	ErrBadTenant = errors.New("invalid tenant config")
	ErrSecret    = errors.New("node secret")
)

// GenerationLookup returns the current token generation of a sandbox, and
// false if the sandbox is unknown.
type GenerationLookup func(sandboxID string) (gen uint64, ok bool)

// Authenticator checks bearer tokens.
type Authenticator struct {
	root    []byte
	tenants map[[32]byte]string // sha256(token) -> tenant name
	secret  []byte
}

// New builds an Authenticator. An empty root token disables root access (every
// root-only route then answers 401), which is what a misconfigured daemon
// should do rather than accept anyone.
func New(rootToken string, tenants []TenantConfig, secret []byte) (*Authenticator, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("%w: must be at least 16 bytes", ErrSecret)
	}
	a := &Authenticator{root: []byte(rootToken), tenants: map[[32]byte]string{}, secret: secret}
	for _, t := range tenants {
		raw, err := hex.DecodeString(t.TokenSHA256)
		if t.Name == "" || err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("%w: tenant %q needs a name and a 64-hex-digit token_sha256", ErrBadTenant, t.Name)
		}
		var k [32]byte
		copy(k[:], raw)
		if prev, dup := a.tenants[k]; dup {
			return nil, fmt.Errorf("%w: tenants %q and %q share a token", ErrBadTenant, prev, t.Name)
		}
		a.tenants[k] = t.Name
	}
	return a, nil
}

// HasRoot reports whether a root token is configured.
func (a *Authenticator) HasRoot() bool { return len(a.root) > 0 }

// HashToken returns the hex SHA-256 of a tenant token, the form config stores.
func HashToken(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// SandboxToken derives the token of sandbox id at generation gen.
func (a *Authenticator) SandboxToken(id string, gen uint64) string {
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte(id))
	var g [8]byte
	binary.BigEndian.PutUint64(g[:], gen)
	m.Write(g[:])
	return "sbt_" + hex.EncodeToString(m.Sum(nil))
}

// Bearer extracts the token of an "Authorization: Bearer <token>" header.
func Bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// Identify resolves a presented token. sandboxID is the sandbox the route is
// about ("" for routes about no sandbox); a sandbox token is only recognised
// for that sandbox, at its current generation.
func (a *Authenticator) Identify(token, sandboxID string, gens GenerationLookup) Identity {
	if token == "" {
		return Identity{}
	}
	if len(a.root) > 0 && subtle.ConstantTimeCompare([]byte(token), a.root) == 1 {
		return Identity{Kind: Root}
	}
	if name, ok := a.tenants[sha256.Sum256([]byte(token))]; ok {
		return Identity{Kind: Tenant, Tenant: name}
	}
	if sandboxID != "" && strings.HasPrefix(token, "sbt_") && gens != nil {
		if gen, ok := gens(sandboxID); ok {
			want := a.SandboxToken(sandboxID, gen)
			if subtle.ConstantTimeCompare([]byte(token), []byte(want)) == 1 {
				return Identity{Kind: Sandbox, SandboxID: sandboxID}
			}
		}
	}
	return Identity{}
}

// LoadOrCreateSecret reads the node secret from path, creating it (32 random
// bytes, mode 0600, fsynced) on first start. The secret must survive restarts:
// a new one would invalidate every sandbox token handed out.
func LoadOrCreateSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if len(b) < 16 {
			return nil, fmt.Errorf("%w: %s holds %d bytes, want >= 16", ErrSecret, path, len(b))
		}
		return b, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %v", ErrSecret, err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSecret, err)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSecret, err)
	}
	_, werr := f.Write(secret)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSecret, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSecret, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return secret, nil
}
