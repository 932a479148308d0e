package envseal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/fsm/egress"
)

func TestSealOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	k, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v %v", st.Mode(), err)
	}
	secret := []byte("ghp_s3cr3t-value")
	s1, err := k.Seal("sb_0000000000000001", "GW_KEY", secret)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := k.Seal("sb_0000000000000001", "GW_KEY", secret)
	if s1 == s2 || !strings.HasPrefix(s1, k.ID()+":") || strings.Contains(s1, string(secret)) {
		t.Fatalf("sealed %q / %q", s1, s2)
	}
	if len(s1) > len(secret)*4/3+egress.MaxSealedOverhead {
		t.Fatalf("sealed value of %d bytes is over the state's bound", len(s1))
	}
	got, err := k.Open("sb_0000000000000001", "GW_KEY", s1)
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("open = %q, %v", got, err)
	}
	// The same file gives the same key.
	again, err := LoadOrCreate(path)
	if err != nil || again.ID() != k.ID() {
		t.Fatal("reloaded key differs")
	}
	if got, err := again.Open("sb_0000000000000001", "GW_KEY", s1); err != nil || !bytes.Equal(got, secret) {
		t.Fatal("reloaded key does not open")
	}
	other, _ := LoadOrCreate(filepath.Join(t.TempDir(), FileName))
	for name, tc := range map[string]struct {
		k                    *Key
		claim, entry, sealed string
	}{
		"other claim": {k, "sb_0000000000000002", "GW_KEY", s1},
		"other name":  {k, "sb_0000000000000001", "OTHER", s1},
		"other key":   {other, "sb_0000000000000001", "GW_KEY", s1},
		"tampered":    {k, "sb_0000000000000001", "GW_KEY", s1[:len(s1)-2] + "AA"},
		"malformed":   {k, "sb_0000000000000001", "GW_KEY", k.ID() + ":!!"},
		"short":       {k, "sb_0000000000000001", "GW_KEY", k.ID() + ":AAAA"},
		"no key id":   {k, "sb_0000000000000001", "GW_KEY", "plain"},
	} {
		if _, err := tc.k.Open(tc.claim, tc.entry, tc.sealed); !errors.Is(err, ErrOpen) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := FromBytes([]byte("short")); err == nil {
		t.Error("a short key was accepted")
	}
}
