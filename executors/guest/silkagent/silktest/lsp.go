package silktest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// StubLSP is a language server small enough for any guest's sh (busybox
// or dash), speaking Content-Length framed JSON-RPC: a request (a message
// with an id) is answered with its id, shutdown with a null result and
// anything else with an initialize-shaped one; a notification (no id) is
// not answered; the exit notification ends it, as it ends a real server.
const StubLSP = `#!/bin/sh
n=0
while IFS= read -r line; do
	line=$(printf '%s' "$line" | tr -d '\r')
	case "$line" in
	Content-Length:*)
		n=${line#Content-Length:}
		n=$(echo $n)
		;;
	"")
		body=$(dd bs=1 count="$n" 2>/dev/null)
		id=$(printf '%s' "$body" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
		method=$(printf '%s' "$body" | sed -n 's/.*"method":"\([^"]*\)".*/\1/p')
		[ "$method" = exit ] && exit 0
		[ -z "$id" ] && continue
		result='{"capabilities":{},"serverInfo":{"name":"stub"}}'
		[ "$method" = shutdown ] && result=null
		resp="{\"jsonrpc\":\"2.0\",\"id\":$id,\"result\":$result}"
		printf 'Content-Length: %d\r\n\r\n%s' "${#resp}" "$resp"
		;;
	esac
done
`

// lspSend writes one framed JSON-RPC message.
func lspSend(t testing.TB, w io.Writer, msg string) {
	t.Helper()
	if _, err := fmt.Fprintf(w, "Content-Length: %d\r\n\r\n%s", len(msg), msg); err != nil {
		t.Fatal(err)
	}
}

// lspReply reads one framed message and decodes it.
func lspReply(t testing.TB, br *bufio.Reader) lspMessage {
	t.Helper()
	n := -1
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading a reply's header: %v", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		if v, ok := strings.CutPrefix(line, "Content-Length: "); ok {
			n, _ = strconv.Atoi(v)
		}
	}
	if n < 0 {
		t.Fatal("a reply without Content-Length")
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatal(err)
	}
	var m lspMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("reply %s: %v", body, err)
	}
	return m
}

// lspMessage is what the suite reads of a reply.
type lspMessage struct {
	ID     int             `json:"id"`
	Result json.RawMessage `json:"result"`
}

// initialize sends an initialize request with id and checks its reply.
func initialize(t testing.TB, s io.Writer, br *bufio.Reader, id int) {
	t.Helper()
	lspSend(t, s, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"initialize","params":{"processId":null,"rootUri":null,"capabilities":{}}}`, id))
	m := lspReply(t, br)
	var res struct {
		Capabilities map[string]any `json:"capabilities"`
	}
	if err := json.Unmarshal(m.Result, &res); err != nil || m.ID != id || res.Capabilities == nil {
		t.Fatalf("initialize reply %+v (result %s): want id %d and capabilities, %v", m, m.Result, id, err)
	}
}

// awaitEnd reads the stream to its end: the server's stdout closed, the
// stream ended by done, nothing more said.
func awaitEnd(t testing.TB, br *bufio.Reader) {
	t.Helper()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the server's end: %q, %v", rest, err)
	}
}

// LSP is acceptance 6: a language without a server, and one whose
// manifest names a binary the guest lacks, are not_found; the stub,
// installed as Base/lsp/stub-lsp.sh and named by a manifest in a.LSPDir for
// the language "sbx-stub", goes through an editor's session over
// lsp_request (initialize round trip, initialized, shutdown, exit) and
// ends with it; another ends when its client closes its side, another by
// lsp_stop. The simulated guest answers the lsp ops unimplemented,
// saying it is simulated.
func LSP(t testing.TB, a Agent) {
	ctx := a.ctx(t)
	c := a.Dial(t)
	if a.Simulated {
		_, err := c.LspStart(ctx, "go", a.Base)
		notSimulated(t, "lsp_start", err)
		_, err = c.LspRequest(ctx, "lsp-1")
		notSimulated(t, "lsp_request", err)
		notSimulated(t, "lsp_stop", c.LspStop(ctx, "lsp-1"))
		return
	}
	if a.LSPDir == "" {
		t.Fatal("silktest: Agent.LSPDir is unset: where the agent reads its language-server manifests")
	}
	start := time.Now()
	base, lspDir := a.Base+"/lsp", a.LSPDir
	if _, err := c.LspStart(ctx, "cobol-no-such-server", base); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("lsp_start of a missing server = %v, want not_found", err)
	}
	if _, err := c.LspStart(ctx, "../etc", base); !errors.Is(err, silkd.ErrBadRequest) {
		t.Fatalf("lsp_start of a language with a path = %v, want bad_request", err)
	}
	if err := c.Mkdir(ctx, base, true); err != nil {
		t.Fatal(err)
	}
	mode := uint32(0o755)
	stub := base + "/stub-lsp.sh"
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: stub, Mode: &mode}, strings.NewReader(StubLSP)); err != nil {
		t.Fatal(err)
	}
	if err := c.Mkdir(ctx, lspDir, true); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: lspDir + "/sbx-stub"}, strings.NewReader(stub+"\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: lspDir + "/sbx-ghost"}, strings.NewReader(base+"/no-such-lsp --stdio\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.LspStart(ctx, "sbx-ghost", base); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("lsp_start of a server the guest lacks = %v, want not_found", err)
	}
	id, err := c.LspStart(ctx, "sbx-stub", base)
	if err != nil {
		t.Fatal(err)
	}
	s, err := a.Dial(t).LspRequest(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// A session as an editor has it: initialize, initialized, shutdown,
	// exit; the server exits and the stream ends with it.
	br := bufio.NewReader(s)
	initialize(t, s, br, 1)
	lspSend(t, s, `{"jsonrpc":"2.0","method":"initialized","params":{}}`)
	lspSend(t, s, `{"jsonrpc":"2.0","id":2,"method":"shutdown"}`)
	if m := lspReply(t, br); m.ID != 2 || string(m.Result) != "null" {
		t.Fatalf("shutdown reply %+v (result %s), want id 2 and null (the notification unanswered)", m, m.Result)
	}
	lspSend(t, s, `{"jsonrpc":"2.0","method":"exit"}`)
	awaitEnd(t, br)
	s.Close()
	// A server serves one lsp_request; it is gone after it.
	if err := c.LspStop(ctx, id); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("lsp_stop of a reaped server = %v, want not_found", err)
	}
	if _, err := a.Dial(t).LspRequest(ctx, id); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("lsp_request of a reaped server = %v, want not_found", err)
	}

	// A client that closes its side (data_end) ends the server too.
	id, err = c.LspStart(ctx, "sbx-stub", base)
	if err != nil {
		t.Fatal(err)
	}
	if s, err = a.Dial(t).LspRequest(ctx, id); err != nil {
		t.Fatal(err)
	}
	br = bufio.NewReader(s)
	initialize(t, s, br, 7)
	if _, err := a.Dial(t).LspRequest(ctx, id); !errors.Is(err, silkd.ErrBadRequest) {
		t.Fatalf("a second lsp_request of an attached server = %v, want bad_request", err)
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	awaitEnd(t, br)
	s.Close()
	if err := c.LspStop(ctx, id); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("lsp_stop of a server whose client closed = %v, want not_found", err)
	}

	// lsp_stop ends a server that nothing attached.
	id2, err := c.LspStart(ctx, "sbx-stub", base)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.LspStop(ctx, id2); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Dial(t).LspRequest(ctx, id2); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("lsp_request of a stopped server = %v", err)
	}
	t.Logf("lsp: not_found twice, three stub servers (a session to exit, a close, a stop): %v", time.Since(start))
}
