package api_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/fsm"
)

const switchingTCP101 = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\n"

// dialPort sends the ports route's request as the old daemon's test and
// clients write it and returns the upgraded connection, or the refusal's
// status and message.
func dialPort(t testing.TB, n *nodetest.Node, id, token, port string, upgrade bool) (*upgraded, int, string) {
	t.Helper()
	c, err := net.Dial("tcp", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := "GET /v1/sandboxes/" + id + "/ports/" + port + " HTTP/1.1\r\nHost: sandboxd\r\n"
	if token != "" {
		req += "Authorization: Bearer " + token + "\r\n"
	}
	if upgrade {
		req += "Upgrade: tcp\r\nConnection: Upgrade\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	if head, err := br.Peek(len(switchingTCP101)); err == nil && string(head) == switchingTCP101 {
		br.Discard(len(switchingTCP101))
		_ = c.SetReadDeadline(time.Time{})
		return &upgraded{Conn: c, r: br}, http.StatusSwitchingProtocols, ""
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusUpgradeRequired && resp.Header.Get("Upgrade") != "tcp" {
		t.Fatalf("426 without Upgrade: tcp: %v", resp.Header)
	}
	return nil, resp.StatusCode, string(b)
}

func TestPortRelayStatuses(t *testing.T) {
	n := newNode(t, 3, nil)
	a := claimAs(t, n, tokA, "")
	b := claimAs(t, n, tokB, "")
	dials := n.Driver.Dials()
	for _, tc := range []struct {
		name, token, port string
		upgrade           bool
		want              int
		msg               string
	}{
		{"no token", "", "7", true, http.StatusUnauthorized, "missing bearer token"},
		{"no upgrade", a.Token, "7", false, http.StatusUpgradeRequired, "upgrade to tcp required"},
		{"port 0", a.Token, "0", true, http.StatusBadRequest, "port must be 1-65535"},
		{"port 65536", a.Token, "65536", true, http.StatusBadRequest, "port must be 1-65535"},
		{"port http", a.Token, "http", true, http.StatusBadRequest, "port must be 1-65535"},
		{"port -1", a.Token, "-1", true, http.StatusBadRequest, "port must be 1-65535"},
		{"port +22", a.Token, "+22", true, http.StatusBadRequest, "port must be 1-65535"},
		{"another sandbox's token", b.Token, "7", true, http.StatusNotFound, "unknown sandbox"},
		{"its tenant's token", tokA, "7", true, http.StatusNotFound, "unknown sandbox"},
		{"nothing listens", a.Token, "8080", true, http.StatusBadGateway, "guest port unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, st, msg := dialPort(t, n, a.ID, tc.token, tc.port, tc.upgrade)
			if st != tc.want || !strings.Contains(msg, `"error":"`+tc.msg+`"`) {
				t.Fatalf("%d %s, want %d %q", st, msg, tc.want, tc.msg)
			}
		})
	}
	// Only the listener that is not there was dialed: the gates come first.
	if got := n.Driver.Dials() - dials; got != 1 {
		t.Fatalf("%d guest dials, want 1", got)
	}
}

// The guest's echo port, 1 MiB each way, with half-close: the client's
// write shutdown reaches the guest socket, whose end comes back.
func TestPortRelayEcho(t *testing.T) {
	n := newNode(t, 1, nil)
	c := claimAs(t, n, rootTok, "")
	u, st, msg := dialPort(t, n, c.ID, c.Token, fmt.Sprint(silkagent.SimEchoPort), true)
	if st != http.StatusSwitchingProtocols {
		t.Fatalf("%d %s", st, msg)
	}
	data := make([]byte, 1<<20)
	rand.Read(data)
	go func() {
		u.Write(data)
		u.Conn.(*net.TCPConn).CloseWrite()
	}()
	back, err := io.ReadAll(u)
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("echo: %d bytes, %v", len(back), err)
	}
	u.Close()
	waitRelays(t, n, c.ID, 0)
	if got := strings.Join(relayEvents(t, n, c.ID), ","); got != "relay_opened port,relay_closed client" {
		t.Fatalf("relay events %s", got)
	}
}

// Root's relay is passive: it opens on a running sandbox without touching
// its activity, and does not wake a hibernated one (409).
func TestPortRelayRootIsPassive(t *testing.T) {
	n := newNode(t, 2, nil)
	c := claimAs(t, n, rootTok, "")
	u, st, msg := dialPort(t, n, c.ID, rootTok, fmt.Sprint(silkagent.SimEchoPort), true)
	if st != http.StatusSwitchingProtocols {
		t.Fatalf("%d %s", st, msg)
	}
	waitRelays(t, n, c.ID, 1)
	var passive bool
	n.Engine.View(func(st *fsm.State) {
		for _, id := range st.RelaysOf(c.ID) {
			r, _ := st.Relay(id)
			passive = r.Passive && r.Kind == fsm.RelayPort && r.Port == silkagent.SimEchoPort
		}
	})
	if !passive {
		t.Fatal("root's port relay is not a passive port relay")
	}
	u.Close()
	waitRelays(t, n, c.ID, 0)

	h := claimAs(t, n, rootTok, "")
	hibernateNow(t, n, h.ID, rootTok)
	if _, st, msg := dialPort(t, n, h.ID, rootTok, "7", true); st != http.StatusConflict {
		t.Fatalf("root on a hibernated sandbox: %d %s", st, msg)
	}
	waitState(t, n, h.ID, "hibernated")
	// The sandbox's own token wakes it.
	if _, st, msg := dialPort(t, n, h.ID, h.Token, "7", true); st != http.StatusSwitchingProtocols {
		t.Fatalf("own token on a hibernated sandbox: %d %s", st, msg)
	}
	var sawWake bool
	for _, e := range relayEvents(t, n, h.ID) {
		sawWake = sawWake || e == "relay_opened port"
	}
	if !sawWake {
		t.Fatal("no port relay opened after the wake")
	}
}
