package natsauth_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/replication/natsauth"
)

func TestConfigValidateAndDescribe(t *testing.T) {
	dir := t.TempDir()
	seed, pub, err := natsauth.NewUserSeed()
	if err != nil {
		t.Fatal(err)
	}
	seedPath := filepath.Join(dir, "u.nk")
	if err := os.WriteFile(seedPath, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := natsauth.PublicKey(seedPath); err != nil || got != pub {
		t.Fatalf("PublicKey = %q, %v; want %q", got, err, pub)
	}
	for _, tc := range []struct {
		name     string
		c        natsauth.Config
		err      string // "" valid
		describe string
	}{
		{"none", natsauth.Config{}, "", "no credentials"},
		{"user", natsauth.Config{User: "u", Password: "hunter2"}, "", "user u"},
		{"token", natsauth.Config{Token: "s3cret"}, "", "token"},
		{"nkey", natsauth.Config{NKeySeedFile: seedPath}, "", "nkey seed file " + seedPath},
		{"two methods", natsauth.Config{Token: "t", NKeySeedFile: seedPath}, "more than one", ""},
		{"password alone", natsauth.Config{Password: "p"}, "needs a user", ""},
		{"cert without key", natsauth.Config{TLSCert: "c.pem"}, "needs its key", ""},
		{"missing seed", natsauth.Config{NKeySeedFile: filepath.Join(dir, "none.nk")}, "seed", ""},
		{"missing creds", natsauth.Config{CredsFile: filepath.Join(dir, "none.creds")}, "creds", ""},
		{"missing CA", natsauth.Config{TLSCA: filepath.Join(dir, "none.pem")}, "rootCA", ""},
	} {
		_, err := tc.c.Options()
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: Options: %v, want %q", tc.name, err, tc.err)
		}
		if tc.describe != "" {
			d := tc.c.Describe()
			if d != tc.describe || strings.Contains(d, "hunter2") || strings.Contains(d, "s3cret") {
				t.Errorf("%s: Describe = %q, want %q", tc.name, d, tc.describe)
			}
		}
	}
	if err := os.WriteFile(seedPath, []byte("not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := natsauth.PublicKey(seedPath); !errors.Is(err, natsauth.ErrSeed) {
		t.Fatalf("PublicKey of garbage: %v", err)
	}
}
