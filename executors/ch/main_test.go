package ch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
)

// chsimBin is the simulator, built once for this test binary.
var chsimBin string

func TestMain(m *testing.M) { os.Exit(chsimbin.RunTests(m, &chsimBin)) }

// shortDir is a temp dir with a short path: unix socket paths are limited to
// 108 bytes, and t.TempDir embeds the test name.
func shortDir(t *testing.T) string { return chsimbin.ShortTempDir(t) }

// startSim runs chsim as its own process on a socket in dir.
func startSim(t *testing.T, dir string, env ...string) *chsimbin.Process {
	return chsimbin.StartT(t, chsimBin, filepath.Join(dir, "api.sock"), env...)
}

// rawCall sends one request to a socket without the client, to see exactly
// what the server answers.
func rawCall(t *testing.T, sock, method, op, body string) (status int, chain []string, raw string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, "http://localhost/api/v1/"+op, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, op, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, op, ct)
	}
	if resp.StatusCode >= 400 && len(data) > 0 {
		if err := json.Unmarshal(data, &chain); err != nil {
			t.Errorf("%s %s: error body %q is not a JSON array of strings", method, op, data)
		}
	}
	return resp.StatusCode, chain, string(data)
}

// guestFiles creates what a VM config points at: a kernel, a disk image.
func guestFiles(t *testing.T, dir string) (kernel, disk string) {
	t.Helper()
	kernel, disk = filepath.Join(dir, "vmlinux"), filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(kernel, []byte("not really a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 16<<20); err != nil {
		t.Fatal(err)
	}
	return kernel, disk
}
