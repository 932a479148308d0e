package auth

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func newAuth(t *testing.T) *Authenticator {
	t.Helper()
	a, err := New("root-tok", []TenantConfig{
		{Name: "a", TokenSHA256: HashToken("tok-a")},
		{Name: "b", TokenSHA256: HashToken("tok-b"), MaxClaims: 3},
	}, bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestIdentify(t *testing.T) {
	a := newAuth(t)
	gens := func(id string) (uint64, bool) {
		if id == "sb_1" {
			return 2, true
		}
		return 0, false
	}
	tok2 := a.SandboxToken("sb_1", 2)
	for _, tc := range []struct {
		name, token, sandbox string
		want                 Identity
	}{
		{"none", "", "", Identity{}},
		{"root", "root-tok", "", Identity{Kind: Root}},
		{"root prefix is not root", "root-to", "", Identity{}},
		{"tenant a", "tok-a", "", Identity{Kind: Tenant, Tenant: "a"}},
		{"tenant b", "tok-b", "sb_1", Identity{Kind: Tenant, Tenant: "b"}},
		{"sandbox current gen", tok2, "sb_1", Identity{Kind: Sandbox, SandboxID: "sb_1"}},
		{"sandbox old gen", a.SandboxToken("sb_1", 1), "sb_1", Identity{}},
		{"sandbox token on other route", tok2, "", Identity{}},
		{"sandbox token for other sandbox", tok2, "sb_2", Identity{}},
		{"garbage", "sbt_zz", "sb_1", Identity{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.Identify(tc.token, tc.sandbox, gens); got != tc.want {
				t.Fatalf("Identify = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestEmptyRootTokenDisablesRoot(t *testing.T) {
	a, err := New("", nil, bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Identify("", "", nil); got.Kind != Anonymous {
		t.Fatalf("empty token identified as %v", got.Kind)
	}
}

func TestNewRejectsBadTenants(t *testing.T) {
	s := bytes.Repeat([]byte{1}, 32)
	for _, tc := range [][]TenantConfig{
		{{Name: "", TokenSHA256: HashToken("x")}},
		{{Name: "a", TokenSHA256: "not-hex"}},
		{{Name: "a", TokenSHA256: HashToken("x")}, {Name: "b", TokenSHA256: HashToken("x")}},
	} {
		if _, err := New("r", tc, s); !errors.Is(err, ErrBadTenant) {
			t.Errorf("New(%+v) = %v, want ErrBadTenant", tc, err)
		}
	}
	if _, err := New("r", nil, []byte("short")); !errors.Is(err, ErrSecret) {
		t.Errorf("short secret accepted: %v", err)
	}
}

func TestSandboxTokenStableAndDistinct(t *testing.T) {
	a := newAuth(t)
	if a.SandboxToken("sb_1", 1) != a.SandboxToken("sb_1", 1) {
		t.Fatal("not deterministic")
	}
	if a.SandboxToken("sb_1", 1) == a.SandboxToken("sb_1", 2) || a.SandboxToken("sb_1", 1) == a.SandboxToken("sb_2", 1) {
		t.Fatal("tokens collide across ids or generations")
	}
}

func TestBearer(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer  abc ")
	if Bearer(r) != "abc" {
		t.Fatalf("Bearer = %q", Bearer(r))
	}
	r.Header.Set("Authorization", "Basic abc")
	if Bearer(r) != "" {
		t.Fatal("non-bearer accepted")
	}
}

func TestLoadOrCreateSecretPersists(t *testing.T) {
	p := filepath.Join(t.TempDir(), "node.secret")
	s1, err := LoadOrCreateSecret(p)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := LoadOrCreateSecret(p)
	if err != nil || !bytes.Equal(s1, s2) {
		t.Fatalf("secret changed across loads: %v", err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateSecret(p); !errors.Is(err, ErrSecret) {
		t.Fatalf("short secret file accepted: %v", err)
	}
}

func TestNormalize(t *testing.T) {
	plain := TenantConfig{Name: "acme", Token: "s3cret"}
	if err := plain.Normalize(); err != nil || plain.Token != "" || plain.TokenSHA256 != HashToken("s3cret") {
		t.Fatalf("plaintext: %+v, %v", plain, err)
	}
	upper := TenantConfig{Name: "acme", TokenSHA256: strings.ToUpper(HashToken("x"))}
	if err := upper.Normalize(); err != nil || upper.TokenSHA256 != HashToken("x") {
		t.Fatalf("upper-case hash: %+v, %v", upper, err)
	}
	for _, bad := range []TenantConfig{
		{Name: "a", Token: "s3cret", TokenSHA256: HashToken("s3cret")},
		{Name: "a"},
		{Name: "a", TokenSHA256: "abcd"},
	} {
		err := bad.Normalize()
		if !errors.Is(err, ErrBadTenant) || strings.Contains(err.Error(), "s3cret") || bad.Token != "" {
			t.Errorf("Normalize(%+v) = %v", bad, err)
		}
	}
}

// A tenant source applies from the next Identify on, and a source whose
// stored hash is not the presented one's is refused.
func TestUseTenants(t *testing.T) {
	a := newAuth(t)
	var table map[[32]byte]string
	a.UseTenants(func(sum [32]byte) (string, [32]byte, bool) {
		name, ok := table[sum]
		return name, sum, ok
	})
	if got := a.Identify("tok-a", "", nil); got.Kind != Anonymous {
		t.Fatalf("tenant a of New still authenticates: %+v", got)
	}
	table = map[[32]byte]string{sha256.Sum256([]byte("tok-c")): "c"}
	if got := a.Identify("tok-c", "", nil); got != (Identity{Kind: Tenant, Tenant: "c"}) {
		t.Fatalf("tok-c: %+v", got)
	}
	a.UseTenants(func(sum [32]byte) (string, [32]byte, bool) { return "c", [32]byte{}, true })
	if got := a.Identify("tok-c", "", nil); got.Kind != Anonymous {
		t.Fatalf("a mismatching stored hash authenticates: %+v", got)
	}
	if !a.IsRoot("root-tok") || a.IsRoot("tok-c") || !a.HasRoot() {
		t.Fatal("IsRoot / HasRoot")
	}
}
