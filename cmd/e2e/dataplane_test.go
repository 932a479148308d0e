package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// dataPlaneDaemon starts the built sandboxd with chsim in dir (its data in
// dir/data, config reused across restarts), one pool of warm VMs and
// tenants a and b.
func dataPlaneDaemon(t *testing.T, dir, addr string, warm int) *daemon {
	t.Helper()
	cfg := filepath.Join(dir, "sandboxd.json")
	writeJSON(t, cfg, map[string]any{
		"listen": addr, "data_dir": filepath.Join(dir, "data"), "node_id": "e2e", "api_token": dpRoot, "hypervisor": "chsim",
		"pools": []any{map[string]any{"template": "e2e", "warm": warm}}, "nats": map[string]any{"disabled": true},
		"tenants": []auth.TenantConfig{{Name: "a", TokenSHA256: auth.HashToken(dpTenantA)}, {Name: "b", TokenSHA256: auth.HashToken(dpTenantB)}},
	})
	return startDaemon(t, dir, filepath.Join(dir, "data"), addr, "-config", cfg)
}

const (
	dpRoot    = "e2e-root-token"
	dpTenantA = "e2e-tenant-a"
	dpTenantB = "e2e-tenant-b"
)

// claimWarm claims from the e2e pool with token, once it has a warm VM.
func claimWarm(t *testing.T, ctx context.Context, addr, token string) *api.ClaimResponse {
	t.Helper()
	c, _ := apiclient.New(addr, token, nil)
	deadline := time.Now().Add(60 * time.Second)
	for {
		cl, err := c.Claim(ctx, api.ClaimRequest{Template: "e2e"})
		if err == nil && cl.Tier == "warm" {
			return cl
		}
		if err == nil {
			return cl // served by a clone: fine too
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agentConn opens the agent relay of sandbox id with token.
func agentConn(ctx context.Context, addr, id, token string) (*silkd.Conn, error) {
	c, err := apiclient.New(addr, token, nil)
	if err != nil {
		return nil, err
	}
	nc, err := c.DialAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	return silkd.NewConn(nc), nil
}

// relayEventsOf reads the op log through /v1/events from its start until
// cond holds, and returns the relay events of claim as "type reason".
func relayEventsOf(t *testing.T, addr, claim string, cond func([]string) bool) []string {
	t.Helper()
	c, _ := apiclient.New(addr, dpRoot, nil)
	col := collect(t, c, apiclient.EventsOptions{From: 1})
	defer col.close()
	var out []string
	col.waitFor(t, "relay events of "+claim, func(evs []apiclient.Event) bool {
		out = out[:0]
		for _, ev := range evs {
			if ev.Event != "relay_opened" && ev.Event != "relay_closed" {
				continue
			}
			le := decode(t, ev)
			if le.Aggregate.ID != claim {
				continue
			}
			var p struct{ Kind, Reason string }
			_ = json.Unmarshal(le.Payload, &p)
			out = append(out, strings.TrimSpace(ev.Event+" "+p.Kind+p.Reason))
		}
		return cond(out)
	})
	return out
}

func count(evs []string, s string) int {
	n := 0
	for _, e := range evs {
		if e == s {
			n++
		}
	}
	return n
}

// TestDataPlaneEndToEnd drives the built sandboxd with chsim's simulated
// guest agent through the data plane: who may open a relay, 200 relays at
// once each moving 1 MiB both ways, a release ending open relays, and a
// SIGKILL with relays open (issue 17, acceptance 2 to 4).
func TestDataPlaneEndToEnd(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	d := dataPlaneDaemon(t, dir, addr, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	x := claimWarm(t, ctx, addr, dpTenantA)
	y := claimWarm(t, ctx, addr, dpTenantA)
	gone := claimWarm(t, ctx, addr, dpTenantB)
	root, _ := apiclient.New(addr, dpRoot, nil)
	if err := root.Release(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}

	// The guest is chsim's simulated agent, and says so.
	sc, err := agentConn(ctx, addr, x.ID, x.Token)
	if err != nil {
		t.Fatal(err)
	}
	info, err := sc.Info(ctx)
	if err != nil || !info.Simulated || info.Agent != chsim.SimAgent || info.Proto < silkd.ProtoKeepAlive {
		t.Fatalf("info through the relay: %+v, %v", info, err)
	}
	var out bytes.Buffer
	if res, err := sc.Exec(ctx, silkd.Exec{Argv: []string{"echo", "hello"}}, silkd.ExecIO{Stdout: &out}); err != nil || res.Code != 0 || out.String() != "hello\n" {
		t.Fatalf("exec echo: %+v %q %v", res, out.String(), err)
	}
	sc.Close()

	// Only the sandbox's own token opens its relay.
	for _, tc := range []struct {
		name, id, token string
		want            int
	}{
		{"another sandbox's token", x.ID, y.Token, 404},
		{"its tenant's token", x.ID, dpTenantA, 404},
		{"another tenant's token", x.ID, dpTenantB, 404},
		{"root's token", x.ID, dpRoot, 404},
		{"a released sandbox's token", gone.ID, gone.Token, 410},
		{"no token", x.ID, "", 401},
	} {
		if _, err := agentConn(ctx, addr, tc.id, tc.token); apiclient.StatusOf(err) != tc.want {
			t.Errorf("%s: %v, want %d", tc.name, err, tc.want)
		}
	}
	if ex, err := apiclient.New(addr, x.Token, nil); err == nil {
		if res, err := ex.Exec(ctx, x.ID, api.ExecRequest{Argv: []string{"echo", "buffered"}}); err != nil || res.Stdout != "buffered\n" || res.ExitCode != 0 {
			t.Fatalf("buffered exec: %+v, %v", res, err)
		}
	}

	// sbxctl reaches the guest the same way.
	env := []string{"SBX_ADDR=" + addr, "SBX_SANDBOX_TOKEN=" + x.Token}
	if out, errs, code := sbxctl(t, dir, env, "exec", x.ID, "--", "echo", "from", "sbxctl"); code != 0 || out != "from sbxctl\n" {
		t.Fatalf("sbxctl exec: exit %d, %q, %s", code, out, errs)
	}
	if _, errs, code := sbxctl(t, dir, env, "exec", x.ID, "--", "false"); code != 1 {
		t.Fatalf("sbxctl exec false: exit %d, %s", code, errs)
	}
	local := filepath.Join(dir, "file.txt")
	writeJSON(t, local, map[string]string{"hello": "guest"})
	if _, errs, code := sbxctl(t, dir, env, "cp", local, x.ID+":/tmp/file.txt"); code != 0 {
		t.Fatalf("sbxctl cp in: exit %d, %s", code, errs)
	}
	if out, errs, code := sbxctl(t, dir, env, "cp", x.ID+":/tmp/file.txt", "-"); code != 0 || !strings.Contains(out, `"hello": "guest"`) {
		t.Fatalf("sbxctl cp out: exit %d, %q, %s", code, out, errs)
	}

	// 200 relays at once on the node, each a port_forward to the guest's
	// echo port moving 1 MiB each way.
	const relays, size = 200, 1 << 20
	var wg sync.WaitGroup
	errs := make(chan error, relays)
	for i := range relays {
		cl := x
		if i%2 == 1 {
			cl = y
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- echoThroughAgent(ctx, addr, cl, size)
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
			if failed <= 3 {
				t.Error(err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d relays failed", failed, relays)
	}

	// A release with relays open ends them; the log says so.
	var open []*silkd.Conn
	for range 3 {
		c, err := agentConn(ctx, addr, y.ID, y.Token)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	if err := root.Release(ctx, y.ID); err != nil {
		t.Fatal(err)
	}
	for i, c := range open {
		_ = c.NetConn().SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.NetConn().Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("relay %d after the release: %v, want EOF", i, err)
		}
	}
	yev := relayEventsOf(t, addr, y.ID, func(evs []string) bool { return count(evs, "relay_closed released") == 3 })
	if opened := count(yev, "relay_opened agent"); opened != relays/2+3 || count(yev, "relay_opened agent") != len(yev)/2 {
		t.Fatalf("y's relay events: %d opened, %d in all", opened, len(yev))
	}

	// SIGKILL with relays open: the clients see the end; after a restart a
	// new relay works and the log shows the old ones closed.
	var held []*silkd.Conn
	for range 2 {
		c, err := agentConn(ctx, addr, x.ID, x.Token)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	for i, c := range held {
		_ = c.NetConn().SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.NetConn().Read(make([]byte, 1)); err == nil {
			t.Fatalf("relay %d still open after SIGKILL", i)
		}
	}
	dataPlaneDaemon(t, dir, addr, 4)
	sc, err = agentConn(ctx, addr, x.ID, x.Token)
	if err != nil {
		t.Fatalf("relay after the restart: %v", err)
	}
	if info, err := sc.Info(ctx); err != nil || !info.Simulated {
		t.Fatalf("info after the restart: %+v, %v", info, err)
	}
	sc.Close()
	// Every relay x had is closed in the log, the two the crash cut off by
	// the restart.
	relayEventsOf(t, addr, x.ID, func(evs []string) bool {
		opened := 0
		for _, e := range evs {
			if strings.HasPrefix(e, "relay_opened") {
				opened++
			}
		}
		return count(evs, "relay_closed restart") == 2 && 2*opened == len(evs)
	})
}

// echoThroughAgent opens cl's agent relay, forwards to the guest's echo
// port and checks size random bytes come back.
func echoThroughAgent(ctx context.Context, addr string, cl *api.ClaimResponse, size int) error {
	sc, err := agentConn(ctx, addr, cl.ID, cl.Token)
	if err != nil {
		return err
	}
	defer sc.Close()
	pc, err := sc.PortForward(ctx, silkagent.SimEchoPort)
	if err != nil {
		return fmt.Errorf("port_forward: %w", err)
	}
	data := make([]byte, size)
	rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := pc.Write(data)
		if err == nil {
			err = pc.CloseWrite()
		}
		werr <- err
	}()
	_ = pc.SetReadDeadline(time.Now().Add(2 * time.Minute))
	back, err := io.ReadAll(pc)
	if err != nil {
		return fmt.Errorf("read the echo: %w", err)
	}
	if err := <-werr; err != nil {
		return err
	}
	if !bytes.Equal(back, data) {
		return fmt.Errorf("relay to %s: %d bytes back, want %d identical", cl.ID, len(back), size)
	}
	return nil
}
