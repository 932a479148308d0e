package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The upstream's package index: a PEP 503 simple index with one project,
// probePkg, whose one file is a pure-Python wheel built here (no network,
// no build tools), so a guest's `pip download` has something real to fetch
// through the egress proxy.
const (
	probePkg     = "sbxprobe"
	probeVersion = "0.1"
	probeWheel   = probePkg + "-" + probeVersion + "-py3-none-any.whl"
)

var probeWheelBytes = sync.OnceValue(buildProbeWheel)

// buildProbeWheel makes the smallest wheel pip accepts: a module, and the
// dist-info's METADATA (name and version match the file name: pip checks),
// WHEEL and RECORD (each file's urlsafe-base64 sha256 and size).
func buildProbeWheel() []byte {
	distInfo := probePkg + "-" + probeVersion + ".dist-info/"
	files := []struct{ name, body string }{
		{probePkg + ".py", "ANSWER = 42\n"},
		{distInfo + "METADATA", "Metadata-Version: 2.1\nName: " + probePkg + "\nVersion: " + probeVersion + "\nSummary: e2e probe\n"},
		{distInfo + "WHEEL", "Wheel-Version: 1.0\nGenerator: sbxlog-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString(distInfo + "RECORD,,\n")
	files = append(files, struct{ name, body string }{distInfo + "RECORD", record.String()})
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			panic(err) // writing to memory
		}
		if _, err := w.Write([]byte(f.body)); err != nil {
			panic(err)
		}
	}
	if err := zw.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// servePackageIndex answers the index's paths (/simple/, /simple/<probePkg>/
// and /packages/<probeWheel>) and reports whether r was one of them.
func servePackageIndex(w http.ResponseWriter, r *http.Request) bool {
	wheel := probeWheelBytes()
	switch r.URL.Path {
	case "/simple/":
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/simple/%s/\">%s</a></body></html>\n", probePkg, probePkg)
	case "/simple/" + probePkg + "/":
		sum := sha256.Sum256(wheel)
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/packages/%s#sha256=%s\">%s</a></body></html>\n", probeWheel, hex.EncodeToString(sum[:]), probeWheel)
	case "/packages/" + probeWheel:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(wheel)
	default:
		return false
	}
	return true
}

// TestPackageIndexPip checks the index and its wheel with the host's pip
// (what the QEMU guests run): `pip download` fetches the wheel, checking
// its hash and its metadata against the file name.
func TestPackageIndexPip(t *testing.T) {
	if err := exec.Command("python3", "-m", "pip", "--version").Run(); err != nil {
		t.Skipf("no pip on the host (python3 -m pip): %v", err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !servePackageIndex(w, r) {
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	dl := t.TempDir()
	cmd := exec.Command("python3", "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
		"--index-url", srv.URL+"/simple/", probePkg, "-d", dl)
	cmd.Env = append(os.Environ(), "PIP_CONFIG_FILE=/dev/null", "http_proxy=", "HTTP_PROXY=", "no_proxy=*")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip download: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(dl, probeWheel))
	if err != nil || !bytes.Equal(got, probeWheelBytes()) {
		t.Fatalf("pip saved %d bytes (%v), want the index's wheel", len(got), err)
	}
}
