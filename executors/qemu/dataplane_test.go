package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

func TestAgentNetArgs(t *testing.T) {
	n := agentNet{Port: 40123, Key: strings.Repeat("ab", 32)}
	got := strings.Join(n.args(), " ")
	want := "-netdev user,id=agentnet,restrict=on,hostfwd=tcp:127.0.0.1:40123-10.0.2.15:2048 -device virtio-net-pci,netdev=agentnet,romfile="
	if got != want {
		t.Fatalf("args %q, want %q", got, want)
	}
	if !hostPortTaken(errors.Join(ErrExited, errors.New("Could not set up host forwarding rule 'tcp:127.0.0.1:1-10.0.2.15:2048'"))) ||
		hostPortTaken(errors.New("Could not set up host forwarding rule")) {
		t.Fatal("hostPortTaken must need both QEMU's exit and its message")
	}
	dir := t.TempDir()
	if _, err := readAgentNet(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no agent.json = %v", err)
	}
	if err := writeAgentNet(dir, n); err != nil {
		t.Fatal(err)
	}
	if back, err := readAgentNet(dir); err != nil || back != n {
		t.Fatalf("read back %+v, %v", back, err)
	}
	if st, err := os.Stat(filepath.Join(dir, FileAgentNet)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("agent.json mode %v, %v: the key is a secret", st.Mode(), err)
	}
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.DialAgent(context.Background(), t.TempDir()); !errors.Is(err, executors.ErrAgentUnreachable) {
		t.Fatalf("DialAgent without an agent network = %v", err)
	}
}

// A local process that binds a dead VM's loopback port before anything
// else does is a listener that cannot prove the key: DialAgent refuses it
// (answering OK is not enough) and sends it nothing but its nonce, so it
// learns neither the key nor the client's silkd stream.
func TestDialAgentRefusesSquatter(t *testing.T) {
	addr, got := guesttest.Squatter(t, "OK\n")
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	key, _ := agent.NewKey()
	n := agentNet{Port: p, Key: key}
	dir := t.TempDir()
	if err := writeAgentNet(dir, n); err != nil {
		t.Fatal(err)
	}
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := q.DialAgent(ctx, dir)
	if err == nil {
		c.Close()
		t.Fatal("DialAgent accepted a listener that answered OK without the key")
	}
	if !errors.Is(err, executors.ErrAgentUnreachable) || !errors.Is(err, agent.ErrGuestUnproven) {
		t.Fatalf("DialAgent = %v, want unreachable: guest unproven", err)
	}
	sent := <-got
	if bytes.Contains(sent, []byte(key)) || !bytes.HasPrefix(sent, []byte("HELLO ")) || bytes.Count(sent, []byte("\n")) != 1 {
		t.Fatalf("the squatter was sent %q, want only the host's HELLO", sent)
	}
}

// The data plane on a real guest under TCG: boot, reach the agent over the
// agent network, exec, 64 MiB through fs_write and fs_read, a forwarded
// guest port, and a hibernate and wake after which the file is still there
// and only the new key opens the agent.
func TestDataPlaneWithQEMU(t *testing.T) {
	ctx, q, spec := bootTCG(t, "qdp", 256, 8*time.Minute)
	dial := func() *silkd.Conn {
		t.Helper()
		c, err := q.DialAgent(ctx, spec.RunDir)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.(*net.TCPConn); !ok {
			t.Fatalf("DialAgent returned %T, want the raw *net.TCPConn", c)
		}
		t.Cleanup(func() { c.Close() })
		return silkd.NewConn(c)
	}
	c := dial()
	info, err := c.Info(ctx)
	if err != nil || info.Simulated || info.Agent != "sbx-agent" || info.Proto != silkd.ProtoKeepAlive {
		t.Fatalf("info %+v, %v", info, err)
	}

	var out, errb bytes.Buffer
	res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"sh", "-c", "echo $((6*7)); echo err >&2; exit 3"}}, silkd.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil || res.Code != 3 || out.String() != "42\n" || errb.String() != "err\n" {
		t.Fatalf("exec = %+v, %v, stdout %q, stderr %q", res, err, out.String(), errb.String())
	}

	big := make([]byte, 64<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(big)
	start := time.Now()
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: "/tmp/big"}, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	t.Logf("fs_write 64 MiB: %v", time.Since(start))
	start = time.Now()
	h := sha256.New()
	if n, err := c.ReadFile(ctx, "/tmp/big", h); err != nil || n != int64(len(big)) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("fs_read: %d bytes, %v, sha256 %x, want %x", n, err, h.Sum(nil), want)
	}
	t.Logf("fs_read 64 MiB: %v", time.Since(start))

	// A TCP server in the guest, reached through port_forward.
	if _, err := c.Exec(ctx, silkd.Exec{Argv: []string{"nc", "-ll", "-p", "8000", "-e", "cat"}, Detach: true}, silkd.ExecIO{}); err != nil {
		t.Fatal(err)
	}
	var p *silkd.PortConn
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err = dial().PortForward(ctx, 8000)
		if err == nil || !errors.Is(err, silkd.ErrNotFound) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // nc is not listening yet
	}
	if err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("through the guest port "), 20000)
	go func() {
		_, _ = p.Write(msg)
		_ = p.CloseWrite()
	}()
	if got, err := io.ReadAll(p); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("port_forward echo: %d bytes of %d, %v", len(got), len(msg), err)
	}

	// Only the VM's key opens the agent.
	n, err := readAgentNet(spec.RunDir)
	if err != nil {
		t.Fatal(err)
	}
	wrong, _ := agent.NewKey()
	if _, err := agent.DialData(ctx, n.addr(), wrong); !errors.Is(err, agent.ErrDataRefused) {
		t.Fatalf("a wrong key = %v, want refused", err)
	}

	start = time.Now()
	if _, err := q.Hibernate(ctx, spec, "hib"); err != nil {
		t.Fatal(err)
	}
	if _, err := q.DialAgent(ctx, spec.RunDir); !errors.Is(err, executors.ErrAgentUnreachable) {
		t.Fatalf("DialAgent of a hibernated VM = %v", err)
	}
	if _, err := q.Wake(ctx, spec, "hib"); err != nil {
		t.Fatal(err)
	}
	t.Logf("hibernate and wake: %v", time.Since(start))
	n2, err := readAgentNet(spec.RunDir)
	if err != nil || n2.Key == n.Key {
		t.Fatalf("after wake: %+v, %v; want a new key", n2, err)
	}
	if _, err := agent.DialData(ctx, n2.addr(), n.Key); !errors.Is(err, agent.ErrDataRefused) {
		t.Fatalf("the key from before the hibernate = %v, want refused", err)
	}
	out.Reset()
	if res, err := dial().Exec(ctx, silkd.Exec{Argv: []string{"sha256sum", "/tmp/big"}}, silkd.ExecIO{Stdout: &out}); err != nil || res.Code != 0 {
		t.Fatalf("sha256sum after wake: %+v, %v", res, err)
	}
	if got := strings.Fields(out.String()); len(got) == 0 || got[0] != hex.EncodeToString(want[:]) {
		t.Fatalf("after wake the guest's file hashes to %q, want %x", out.String(), want)
	}
	if _, err := q.Destroy(ctx, spec); err != nil {
		t.Fatal(err)
	}
}
