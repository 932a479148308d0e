package ch_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// replay serves status and body for every request on a fresh unix socket.
func replay(t *testing.T, status int, body string) *ch.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ch.New(sock)
}

// TestRecordedErrorBodies types each recorded CH error body.
func TestRecordedErrorBodies(t *testing.T) {
	type want struct {
		notFound, badRequest, conflict, invalidState bool
		pauseOK, resumeOK                            bool // Pause/Resume treat it as success
		chainLen                                     int
	}
	cases := map[string]want{
		"vm.pause-paused.500.json":            {invalidState: true, pauseOK: true, chainLen: 5},
		"vm.resume-running.500.json":          {invalidState: true, resumeOK: true, chainLen: 5},
		"vm.pause-not-running.500.json":       {invalidState: true, chainLen: 3},
		"vm.shutdown-not-running.500.json":    {invalidState: true, chainLen: 3},
		"vm.boot-running.500.json":            {invalidState: true, resumeOK: true, chainLen: 3},
		"vm.snapshot-running.500.json":        {invalidState: true, chainLen: 5},
		"vm.snapshot-exists.500.json":         {chainLen: 5},
		"vm.restore-already-created.500.json": {conflict: true, chainLen: 3},
		"vm.create-already-created.500.json":  {conflict: true, chainLen: 3},
		"vm.info-not-created.404.json":        {notFound: true, chainLen: 3},
		"vm.boot-missing-config.404.json":     {notFound: true, chainLen: 3},
		"vm.remove-device-unknown.404.json":   {notFound: true, chainLen: 3},
		"vm.add-net-duplicate.409.json":       {conflict: true, chainLen: 4},
		"route-unknown.404.json":              {notFound: true, chainLen: 1},
		"wrong-method.400.json":               {badRequest: true, chainLen: 1},
		"wrong-method-generic.400.json":       {badRequest: true, chainLen: 0},
		"vm.restore-bad-json.400.json":        {badRequest: true, chainLen: 2},
		"legacy-debug.500.txt":                {invalidState: true, pauseOK: true, chainLen: 0},
	}
	files, err := filepath.Glob("testdata/errors/*.*")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, f := range files {
		name := filepath.Base(f)
		if name == "README.md" {
			continue
		}
		w, ok := cases[name]
		if !ok {
			t.Errorf("%s: recorded body without expectations", name)
			continue
		}
		seen++
		t.Run(name, func(t *testing.T) {
			body, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			parts := strings.Split(name, ".")
			status, err := strconv.Atoi(parts[len(parts)-2])
			if err != nil {
				t.Fatalf("file name carries no status: %v", err)
			}
			c := replay(t, status, string(body))
			ctx := context.Background()

			_, err = c.Info(ctx)
			var ae *ch.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("Info: %v is not an *APIError", err)
			}
			if ae.Op != "vm.info" || ae.Status != status || len(ae.Chain) != w.chainLen {
				t.Errorf("APIError = op %q status %d chain %q", ae.Op, ae.Status, ae.Chain)
			}
			if w.chainLen == 0 && len(body) > 0 && !strings.Contains(ae.Error(), strings.TrimSpace(string(body))) {
				t.Errorf("raw body lost from %q", ae.Error())
			}
			for _, c := range []struct {
				name     string
				got, exp bool
			}{
				{"IsNotFound", ch.IsNotFound(err), w.notFound},
				{"IsBadRequest", ch.IsBadRequest(err), w.badRequest},
				{"IsConflict", ch.IsConflict(err), w.conflict},
				{"IsInvalidState", ch.IsInvalidState(err), w.invalidState},
				{"IsVMMGone", ch.IsVMMGone(err), false},
			} {
				if c.got != c.exp {
					t.Errorf("%s = %v, want %v", c.name, c.got, c.exp)
				}
			}
			if err := c.Pause(ctx); (err == nil) != w.pauseOK {
				t.Errorf("Pause = %v, want success %v", err, w.pauseOK)
			}
			if err := c.Resume(ctx); (err == nil) != w.resumeOK {
				t.Errorf("Resume = %v, want success %v", err, w.resumeOK)
			}
		})
	}
	if seen != len(cases) {
		t.Errorf("found %d recorded bodies, expected %d", seen, len(cases))
	}
}

func TestTransportErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	t.Run("no socket", func(t *testing.T) {
		_, err := ch.New(filepath.Join(dir, "missing.sock")).Ping(ctx)
		if !ch.IsVMMGone(err) || !errors.Is(err, ch.ErrVMMGone) {
			t.Fatalf("err = %v, want ErrVMMGone", err)
		}
		var te *ch.TransportError
		if !errors.As(err, &te) || te.Op != "vmm.ping" {
			t.Fatalf("err = %#v, want *TransportError for vmm.ping", err)
		}
	})

	t.Run("stale socket", func(t *testing.T) {
		sock := filepath.Join(dir, "stale.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close() // the file stays, nobody listens: a crashed VMM
		if _, err := os.Stat(sock); err != nil {
			t.Fatal(err)
		}
		if err := ch.New(sock).Pause(ctx); !errors.Is(err, ch.ErrVMMGone) {
			t.Fatalf("err = %v, want ErrVMMGone", err)
		}
	})

	t.Run("connection dropped", func(t *testing.T) {
		sock := filepath.Join(dir, "drop.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				buf := make([]byte, 4096)
				_, _ = c.Read(buf)
				c.Close() // read the request, die before answering
			}
		}()
		err = ch.New(sock).Snapshot(ctx, "file:///tmp/x")
		if !errors.Is(err, ch.ErrConnectionLost) || errors.Is(err, ch.ErrVMMGone) {
			t.Fatalf("err = %v, want ErrConnectionLost only", err)
		}
	})

	// hang serves a socket that reads requests and never answers; a
	// value on accepted is sent once a request's first bytes arrived.
	hang := func(t *testing.T) (sock string, accepted <-chan struct{}) {
		sock = filepath.Join(t.TempDir(), "hang.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		got := make(chan struct{}, 16)
		t.Cleanup(func() { close(done); ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					var b [1]byte
					if _, err := c.Read(b[:]); err == nil {
						select {
						case got <- struct{}{}:
						default:
						}
					}
					<-done
					c.Close()
				}()
			}
		}()
		return sock, got
	}

	t.Run("per-call timeout", func(t *testing.T) {
		sock, _ := hang(t)
		c := ch.New(sock, ch.WithTimeouts(ch.Timeouts{Call: 50 * time.Millisecond}))
		start := time.Now()
		_, err := c.Info(ctx)
		if !errors.Is(err, ch.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrTimeout and DeadlineExceeded", err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("timeout took %s", el)
		}
	})

	t.Run("caller cancels", func(t *testing.T) {
		sock, accepted := hang(t)
		c := ch.New(sock)
		cctx, cancel := context.WithCancel(ctx)
		// Cancel once the request is in flight (the server has its bytes).
		go func() { <-accepted; cancel() }()
		err := c.Boot(cctx)
		if !errors.Is(err, context.Canceled) || errors.Is(err, ch.ErrTimeout) {
			t.Fatalf("err = %v, want context.Canceled only", err)
		}
	})
}

func TestClientRejectsBadInput(t *testing.T) {
	c := ch.New(filepath.Join(t.TempDir(), "none.sock"))
	ctx := context.Background()
	for name, err := range map[string]error{
		"Create(nil)":     c.Create(ctx, nil),
		"Restore(empty)":  c.Restore(ctx, ch.RestoreConfig{}),
		"Resize(nothing)": c.Resize(ctx, ch.Resize{}),
	} {
		var te *ch.TransportError
		if err == nil || errors.As(err, &te) {
			t.Errorf("%s = %v, want a local error before dialing", name, err)
		}
	}
}

func TestFileURL(t *testing.T) {
	u, err := ch.FileURL("/srv/snap/../snap/a")
	if err != nil || u != "file:///srv/snap/a" {
		t.Fatalf("FileURL = %q, %v", u, err)
	}
	if _, err := ch.FileURL("rel/dir"); err == nil {
		t.Fatal("relative dir accepted")
	}
	p, err := ch.URLPath(u)
	if err != nil || p != "/srv/snap/a" {
		t.Fatalf("URLPath = %q, %v", p, err)
	}
	for _, bad := range []string{"http://x/y", "file://", "file://rel", "/abs"} {
		if _, err := ch.URLPath(bad); err == nil {
			t.Errorf("URLPath(%q) accepted", bad)
		}
	}
}
