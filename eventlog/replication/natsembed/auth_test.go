package natsembed_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbxlog/sbxlog/eventlog/replication/natsauth"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
)

// A server with NKeys refuses a client without credentials and one with
// another user's seed, and lets the seed's holder in.
func TestNKeysRefuseOtherClients(t *testing.T) {
	dir := t.TempDir()
	seedFile := func(name string) (path, pub string) {
		seed, pub, err := natsauth.NewUserSeed()
		if err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(dir, name)
		if err := os.WriteFile(path, seed, 0o600); err != nil {
			t.Fatal(err)
		}
		return path, pub
	}
	mine, pub := seedFile("mine.nk")
	other, _ := seedFile("other.nk")
	s, err := natsembed.Start(natsembed.Options{StoreDir: filepath.Join(dir, "nats"), NKeys: []string{pub}, Logger: natstest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)

	connect := func(opts ...nats.Option) error {
		nc, err := nats.Connect(s.ClientURL(), append(opts, nats.Timeout(2*time.Second), nats.NoReconnect())...)
		if err == nil {
			nc.Close()
		}
		return err
	}
	if err := connect(); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("client without credentials: %v, want an authorization violation", err)
	}
	opt, err := natsauth.Config{NKeySeedFile: other}.Options()
	if err != nil {
		t.Fatal(err)
	}
	if err := connect(opt...); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("client with another seed: %v, want an authorization violation", err)
	}
	opt, err = natsauth.Config{NKeySeedFile: mine}.Options()
	if err != nil {
		t.Fatal(err)
	}
	if err := connect(opt...); err != nil {
		t.Fatalf("client with the seed: %v", err)
	}
	if _, err := natsembed.Start(natsembed.Options{StoreDir: t.TempDir(), NKeys: []string{"UNOTAKEY"}}); err == nil || !strings.Contains(err.Error(), "NKey") {
		t.Fatalf("a bad public key: %v", err)
	}
}
