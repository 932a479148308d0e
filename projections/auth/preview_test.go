package auth

import (
	"strings"
	"testing"
)

// A preview token says what it was signed with, and only the node secret
// that signed it accepts it: a changed byte anywhere, another node's
// secret, or a sandbox token in its place is refused.
func TestPreviewToken(t *testing.T) {
	a, err := New("root", nil, []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := New("root", nil, []byte("fedcba9876543210fedcba9876543210"))
	if err != nil {
		t.Fatal(err)
	}
	p := Preview{Sandbox: "sb_0123456789abcdef", Gen: 3, Port: 8080, Expires: 1_900_000_000}
	tok := a.PreviewToken(p)
	if strings.ContainsAny(tok, "/+=?#%") {
		t.Fatalf("token %q is not one URL path segment", tok)
	}
	if got, ok := a.VerifyPreview(tok); !ok || got != p {
		t.Fatalf("VerifyPreview = %+v, %v; want %+v", got, ok, p)
	}
	bad := []string{"", ".", "x.y", tok + "x", strings.Replace(tok, ".", "", 1), a.SandboxToken(p.Sandbox, p.Gen)}
	for i := range tok {
		b := []byte(tok)
		if b[i] == '.' {
			continue
		}
		b[i] = map[bool]byte{true: 'B', false: 'A'}[b[i] == 'A']
		bad = append(bad, string(b))
	}
	for _, s := range bad {
		if got, ok := a.VerifyPreview(s); ok && got == p {
			t.Fatalf("VerifyPreview(%q) accepted a changed token", s)
		}
	}
	if _, ok := other.VerifyPreview(tok); ok {
		t.Fatal("another node's secret accepted the token")
	}
}
