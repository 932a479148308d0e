package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// TestDebianQEMU is issue 23's acceptance 7 on the real guest: the built
// sandboxd on the QEMU driver (TCG) serving the Debian template as
// "default" (qemu.templates); a claim, then through the sandbox's agent
// relay `python3 -c 'print(6*7)'` and the SSH server's banner through
// port_forward to 22.
func TestDebianQEMU(t *testing.T) {
	g := guesttest.RequireDebian(t)
	dir, err := os.MkdirTemp("", "dbq") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	addr := freeAddr(t)
	cfg := filepath.Join(dir, "sandboxd.json")
	writeJSON(t, cfg, map[string]any{
		"listen": addr, "data_dir": data, "node_id": "e2e", "api_token": dpRoot, "hypervisor": "qemu",
		"qemu": map[string]any{"accel": "tcg", "templates": map[string]any{
			"default": map[string]any{"kernel": g.Kernel, "initrd": g.Initrd, "disk": g.Disk},
		}},
		"pools": []any{map[string]any{"template": "default", "warm": 1}}, "nats": map[string]any{"disabled": true},
	})
	t.Cleanup(func() { killQEMUs(t, dir) }) // after sandboxd's stop
	startDaemon(t, dir, data, addr, "-config", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, _ := apiclient.New(addr, dpRoot, nil)
	var cl *api.ClaimResponse
	for deadline := time.Now().Add(5 * time.Minute); ; {
		cl, err = root.Claim(ctx, api.ClaimRequest{Template: "default"})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second) // the golden is still being built
	}
	if err != nil {
		t.Fatal(err)
	}
	sb, err := apiclient.New(addr, cl.Token, nil)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() *silkd.Conn {
		t.Helper()
		nc, err := sb.DialAgent(ctx, cl.ID)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return silkd.NewConn(nc)
	}

	var out bytes.Buffer
	res, err := dial().Exec(ctx, silkd.Exec{Argv: []string{"python3", "-c", "print(6*7)"}}, silkd.ExecIO{Stdout: &out})
	if err != nil || res.Code != 0 || out.String() != "42\n" {
		t.Fatalf("python3: %+v, %v, stdout %q", res, err, out.String())
	}

	var p *silkd.PortConn
	for deadline := time.Now().Add(30 * time.Second); ; {
		p, err = dial().PortForward(ctx, 22)
		if err == nil || !errors.Is(err, silkd.ErrNotFound) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // dropbear is not listening yet
	}
	if err != nil {
		t.Fatalf("port_forward 22: %v", err)
	}
	defer p.Close()
	banner, err := bufio.NewReader(p).ReadString('\n')
	if err != nil || !strings.HasPrefix(banner, "SSH-2.0-") {
		t.Fatalf("port 22 said %q, %v; want an SSH-2.0- banner", banner, err)
	}
	t.Logf("port 22 through the relay: %q", strings.TrimSpace(banner))
}
