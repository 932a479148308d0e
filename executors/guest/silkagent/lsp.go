package silkagent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Timings of the language-server broker.
const (
	// LSPAttachTTL is how long a started server may wait for its
	// lsp_request before it is killed: a client that died between the two
	// calls must not pin a language server for the guest's life.
	LSPAttachTTL = 5 * time.Minute
	// LSPStopGrace is how long a server whose stdin was closed (data_end,
	// or the client's stream ended) may take to exit before it is killed.
	LSPStopGrace = 5 * time.Second
	// lspManifestBytes bounds a manifest file.
	lspManifestBytes = 4096
)

// DefaultLSPDir is where a guest image names its language servers: the
// file <language> holds the server's argv, split on white space (the old
// agent's /etc/silkd/lsp.d, so flavor images carry over).
const DefaultLSPDir = "/etc/silkd/lsp.d"

// wellKnownLSP are the servers tried, on the guest's PATH, for a language
// without a manifest.
var wellKnownLSP = map[string][]string{
	"python":     {"pylsp"},
	"go":         {"gopls"},
	"rust":       {"rust-analyzer"},
	"typescript": {"typescript-language-server", "--stdio"},
	"javascript": {"typescript-language-server", "--stdio"},
	"c":          {"clangd"},
	"cpp":        {"clangd"},
}

// lspTable is the started language servers, by server id.
type lspTable struct {
	mu   sync.Mutex
	m    map[string]*lspServer
	next atomic.Uint64
}

type lspServer struct {
	p        Process
	attached bool
	reaped   sync.Once
	ttl      *time.Timer
}

// reap kills the server and waits for it (no zombie survives). Its
// output is closed by its reader, the lsp_request, if it has one.
func (l *lspServer) reap() {
	l.reaped.Do(func() {
		if l.ttl != nil {
			l.ttl.Stop()
		}
		_ = l.p.Signal(syscall.SIGKILL)
		_ = l.p.Stdin().Close()
		l.p.Wait()
		if !l.attached {
			l.p.CloseOutput()
		}
	})
}

// take removes id from the table.
func (t *lspTable) take(id string) *lspServer {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.m[id]
	delete(t.m, id)
	return l
}

// lspArgv finds the server for language: its manifest in dir, else a
// well-known server on PATH. None is not_found, as on the old base image.
func lspArgv(dir, language string) ([]string, error) {
	if language == "" || strings.ContainsAny(language, "/\\\x00") || strings.Contains(language, "..") {
		return nil, badRequest("lsp_start: invalid language %q", language)
	}
	var argv []string
	if f, err := os.OpenFile(filepath.Join(dir, language), os.O_RDONLY|syscall.O_NOFOLLOW, 0); err == nil {
		b, err := io.ReadAll(io.LimitReader(f, lspManifestBytes))
		f.Close()
		if err != nil {
			return nil, err
		}
		argv = strings.Fields(string(b))
	}
	if len(argv) == 0 {
		argv = wellKnownLSP[language]
	}
	if len(argv) == 0 {
		return nil, silkd.Errorf(silkd.KindNotFound, "no language server for %q; a guest image provides one in %s/%s", language, dir, language)
	}
	bin, err := lookPath(argv[0], DefaultPath)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		return nil, silkd.Errorf(silkd.KindNotFound, "no language server for %q: %s is not in the guest", language, argv[0])
	}
	return argv, nil
}

// lspStart runs lsp_start: the server is spawned with the exec backend
// (PATH and proxies as exec's) in root and waits for its lsp_request for
// at most LSPAttachTTL.
func (s *Server) lspStart(req *silkd.LspStart) (silkd.Response, error) {
	argv, err := lspArgv(s.LSPDir, req.Language)
	if err != nil {
		return nil, err
	}
	p, err := s.Procs.Spawn(&silkd.Exec{Argv: argv, Cwd: req.Root})
	if err != nil {
		return nil, err
	}
	// The server's stderr is its log; nobody reads it, so it is drained.
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	t := &s.lsp
	id := fmt.Sprintf("lsp-%d", t.next.Add(1))
	l := &lspServer{p: p}
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]*lspServer{}
	}
	t.m[id] = l
	l.ttl = time.AfterFunc(LSPAttachTTL, func() {
		t.mu.Lock()
		unattached := t.m[id] == l && !l.attached
		if unattached {
			delete(t.m, id)
		}
		t.mu.Unlock()
		if unattached {
			l.reap()
		}
	})
	t.mu.Unlock()
	return silkd.LspStarted{ServerID: id}, nil
}

// lspStop runs lsp_stop.
func (s *Server) lspStop(req *silkd.LspStop) (silkd.Response, error) {
	l := s.lsp.take(req.ServerID)
	if l == nil {
		return nil, silkd.Errorf(silkd.KindNotFound, "no such lsp server %q", req.ServerID)
	}
	l.reap()
	return silkd.Done{}, nil
}

// lspRequest runs lsp_request: ready, then the data frames go to the
// server's stdin (data_end, another frame or the end of the client's
// stream closes it; the server then has LSPStopGrace to exit) and its
// stdout comes back as data frames, then done at its EOF. A server serves
// one lsp_request: when it ends the server is reaped, as the old broker
// did (a JSON-RPC stream cut mid-message cannot be resumed).
func (s *Server) lspRequest(req *silkd.LspRequest, w *silkd.Writer) *call {
	t := &s.lsp
	t.mu.Lock()
	l := t.m[req.ServerID]
	busy := l != nil && l.attached
	if l != nil && !busy {
		l.attached = true
		l.ttl.Stop()
	}
	t.mu.Unlock()
	switch {
	case l == nil:
		_ = w.WriteResponse(silkd.Errorf(silkd.KindNotFound, "no such lsp server %q", req.ServerID))
		return finished()
	case busy:
		_ = w.WriteResponse(badRequest("lsp server %q already attached", req.ServerID))
		return finished()
	}
	if err := w.WriteResponse(silkd.Ready{}); err != nil {
		t.take(req.ServerID)
		l.reap()
		return finished()
	}
	c := &call{done: make(chan struct{})}
	stdin := l.p.Stdin()
	var wbroken atomic.Bool
	c.feed = func(in silkd.Request) {
		switch v := in.(type) {
		case *silkd.Data:
			if !wbroken.Load() {
				if _, err := stdin.Write(v.Data); err != nil {
					wbroken.Store(true)
				}
			}
		default:
			c.end()
		}
	}
	c.endFn = func() {
		_ = stdin.Close()
		time.AfterFunc(LSPStopGrace, func() { _ = l.p.Signal(syscall.SIGKILL) })
	}
	go func() {
		defer c.finish()
		// The server is out of the table and reaped before the stream's
		// last frame: a client that saw it end finds the server gone.
		end := func(last silkd.Response) {
			t.mu.Lock()
			if t.m[req.ServerID] == l {
				delete(t.m, req.ServerID)
			}
			t.mu.Unlock()
			l.reap()
			l.p.CloseOutput()
			if last != nil {
				_ = w.WriteResponse(last)
			}
		}
		buf := make([]byte, silkd.BulkChunk)
		out := l.p.Stdout()
		for {
			n, err := out.Read(buf)
			if n > 0 {
				if werr := w.WriteBulk(silkd.BulkDataReply, buf[:n]); werr != nil {
					end(nil) // the client is gone
					return
				}
			}
			if err == io.EOF {
				end(silkd.Done{})
				return
			}
			if err != nil {
				end(silkd.Errorf(silkd.KindInternal, "lsp_request: read the server's stdout: %v", err))
				return
			}
		}
	}()
	return c
}
