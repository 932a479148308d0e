// Package auth decides who is calling the HTTP API: the root token (from
// config), a tenant token (known only by its SHA-256) or a sandbox token.
//
// Tenant tokens are looked up by their SHA-256 in a TenantSource: the node
// plugs in the state's tenant table (UseTenants), so a tenant created,
// rotated or removed over the API applies to the next request; without a
// source, the tenants given to New. A plaintext token in a tenant's config
// (the old daemon's `token`) is hashed by Normalize and never kept.
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
	"sync/atomic"
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

// TenantConfig is a tenant as configured: its name, its token as the hex
// SHA-256 (token_sha256) or, as the old daemon's config had it, in plaintext
// (token: Normalize hashes it and clears it), an optional cap on live claims
// (0 = none) and egress class.
type TenantConfig struct {
	Name        string `json:"name"`
	Token       string `json:"token,omitempty"`
	TokenSHA256 string `json:"token_sha256,omitempty"`
	MaxClaims   int    `json:"max_claims,omitempty"`
	EgressClass string `json:"egress_class,omitempty"`
}

// Normalize leaves t with its token as lowercase hex SHA-256 only: a
// plaintext Token is hashed into TokenSHA256 and cleared, so it is never
// stored or logged. Both forms, neither, or a malformed hash are
// ErrBadTenant (the error never carries the token).
func (t *TenantConfig) Normalize() error {
	switch {
	case t.Token != "" && t.TokenSHA256 != "":
		t.Token = ""
		return fmt.Errorf("%w: tenant %q: give token or token_sha256, not both", ErrBadTenant, t.Name)
	case t.Token != "":
		t.TokenSHA256, t.Token = HashToken(t.Token), ""
		return nil
	}
	raw, err := hex.DecodeString(t.TokenSHA256)
	if err != nil || len(raw) != sha256.Size {
		return fmt.Errorf("%w: tenant %q needs a token or a 64-hex-digit token_sha256", ErrBadTenant, t.Name)
	}
	t.TokenSHA256 = hex.EncodeToString(raw)
	return nil
}

// Errors returned by New and LoadOrCreateSecret.
var (
	ErrBadTenant = errors.New("invalid tenant config")
	ErrSecret    = errors.New("node secret")
)

// TenantSource resolves the SHA-256 of a presented token to the tenant
// holding it: its name and its stored hash (compared in constant time
// with the presented one), and false when no tenant holds it.
type TenantSource func(sum [32]byte) (name string, stored [32]byte, ok bool)

// GenerationLookup returns the current token generation of a sandbox, and
// false if the sandbox is unknown.
type GenerationLookup func(sandboxID string) (gen uint64, ok bool)

// Authenticator checks bearer tokens.
type Authenticator struct {
	root    []byte
	tenants atomic.Pointer[TenantSource]
	secret  []byte
}

// New builds an Authenticator whose tenants are the given ones (until
// UseTenants replaces them). An empty root token disables root access
// (every root-only route then answers 401), which is what a misconfigured
// daemon should do rather than accept anyone.
func New(rootToken string, tenants []TenantConfig, secret []byte) (*Authenticator, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("%w: must be at least 16 bytes", ErrSecret)
	}
	a := &Authenticator{root: []byte(rootToken), secret: secret}
	static := map[[32]byte]string{}
	for _, t := range tenants {
		if t.Name == "" {
			return nil, fmt.Errorf("%w: a tenant needs a name", ErrBadTenant)
		}
		if err := t.Normalize(); err != nil {
			return nil, err
		}
		var k [32]byte
		_, _ = hex.Decode(k[:], []byte(t.TokenSHA256))
		if prev, dup := static[k]; dup {
			return nil, fmt.Errorf("%w: tenants %q and %q share a token", ErrBadTenant, prev, t.Name)
		}
		static[k] = t.Name
	}
	a.UseTenants(func(sum [32]byte) (string, [32]byte, bool) {
		name, ok := static[sum]
		return name, sum, ok
	})
	return a, nil
}

// UseTenants makes src the tenants' source from the next request on.
func (a *Authenticator) UseTenants(src TenantSource) { a.tenants.Store(&src) }

// HasRoot reports whether a root token is configured.
func (a *Authenticator) HasRoot() bool { return len(a.root) > 0 }

// IsRoot reports whether token is the root token (constant-time).
func (a *Authenticator) IsRoot(token string) bool {
	return len(a.root) > 0 && subtle.ConstantTimeCompare([]byte(token), a.root) == 1
}

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
	if a.IsRoot(token) {
		return Identity{Kind: Root}
	}
	sum := sha256.Sum256([]byte(token))
	if name, stored, ok := (*a.tenants.Load())(sum); ok && subtle.ConstantTimeCompare(sum[:], stored[:]) == 1 {
		return Identity{Kind: Tenant, Tenant: name}
	}
	if sandboxID != "" && strings.HasPrefix(token, "sbt_") && gens != nil {
		if gen, ok := gens(sandboxID); ok && a.IsSandboxToken(token, sandboxID, gen) {
			return Identity{Kind: Sandbox, SandboxID: sandboxID}
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
