package node

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/eventlog"
)

// The embedded server's port taken by someone else falls back to a free one
// with RetryFreePort (sandboxd's default port); a configured port that is taken is an error.
func TestStartReplicationPortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name string
		repl Replication
		ok   bool
	}{
		{"default port taken", Replication{Options: replication.Options{Port: port}, RetryFreePort: true}, true},
		{"configured port taken", Replication{Options: replication.Options{Port: port}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := eventlog.Open(filepath.Join(dir, "log"), eventlog.Options{NodeID: "n1"})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			n := &Node{Log: l, cfg: Config{DataDir: dir, OwnerAddr: "127.0.0.1:1"}, zl: zerolog.Nop()}
			svc, err := n.startReplication(tc.repl)
			if !tc.ok {
				if err == nil {
					_ = svc.Close()
					t.Fatal("started on a port in use")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer svc.Close()
			if svc.Server == nil || svc.Server.Port() == port || svc.Server.Port() == 0 || svc.URL != svc.Server.ClientURL() {
				t.Fatalf("embedded server %v at %s (port %d was taken)", svc.Server, svc.URL, port)
			}
		})
	}
}
