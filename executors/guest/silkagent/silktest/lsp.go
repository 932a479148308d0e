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
// or dash): it answers each Content-Length framed JSON-RPC request with an
// initialize-shaped result carrying the request's id.
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
		resp="{\"jsonrpc\":\"2.0\",\"id\":$id,\"result\":{\"capabilities\":{},\"serverInfo\":{\"name\":\"stub\"}}}"
		printf 'Content-Length: %d\r\n\r\n%s' "${#resp}" "$resp"
		;;
	esac
done
`

// LSP is acceptance 6: a language without a server, and one whose
// manifest names a binary the guest lacks, are not_found; the stub,
// installed as Base/lsp/stub-lsp.sh and named by a manifest in a.LSPDir for
// the language "sbx-stub", answers an initialize request through
// lsp_request. The simulated guest answers the lsp ops unimplemented,
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
	req := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"processId":null,"rootUri":null,"capabilities":{}}}`
	if _, err := fmt.Fprintf(s, "Content-Length: %d\r\n\r\n%s", len(req), req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(s)
	var n int
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the reply's header: %v", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		if v, ok := strings.CutPrefix(line, "Content-Length: "); ok {
			n, _ = strconv.Atoi(v)
		}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatal(err)
	}
	var reply struct {
		ID     int `json:"id"`
		Result struct {
			Capabilities map[string]any `json:"capabilities"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &reply); err != nil || reply.ID != 1 || reply.Result.Capabilities == nil {
		t.Fatalf("initialize reply %s: %+v, %v", body, reply, err)
	}
	// Closing its stdin ends the server; the stream ends with done.
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the server's end: %q, %v", rest, err)
	}
	s.Close()
	// A server serves one lsp_request; it is gone after it.
	if err := c.LspStop(ctx, id); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("lsp_stop of a reaped server = %v, want not_found", err)
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
	t.Logf("lsp: start, initialize round trip, stop: %v", time.Since(start))
}
