package node

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/replication"
	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/procstat"
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

// A step that fails undoes the earlier ones and returns its error: here the
// listen of step 10, after the engine, executors and loops started.
func TestStartFailureUndoes(t *testing.T) {
	dir := t.TempDir()
	_, err := Start(context.Background(), Config{DataDir: dir, NodeID: "n1", Listen: "256.0.0.1:1", Log: zerolog.Nop()}, stubHypervisor{})
	if err == nil {
		t.Fatal("started on an address that cannot be bound")
	}
	// The log was closed: it opens again.
	l, err := eventlog.Open(filepath.Join(dir, "log"), eventlog.Options{NodeID: "n1"})
	if err != nil {
		t.Fatalf("log not closed by the failed start: %v", err)
	}
	l.Close()
}

// stubHypervisor's driver answers nothing it is not asked; the failed
// start above never runs an intent.
type stubHypervisor struct{}

func (stubHypervisor) Name() string { return "stub" }
func (stubHypervisor) Open(layout.Roots, string) (Driver, error) {
	return stubDriver{}, nil
}

type stubDriver struct{ executors.Driver }

func (stubDriver) Prepare(context.Context) (Prepared, error) { return Prepared{}, nil }
func (stubDriver) OnExit(func(vm, detail string))            {}
func (stubDriver) Close()                                    {}
func (stubDriver) VMMUsage(context.Context, string, string) (procstat.Usage, error) {
	return procstat.Usage{}, procstat.ErrNoProcess
}
