package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// sandboxd --version prints the build from Go's build info (never the
// bare "dev" of before) and starts nothing.
func TestVersionFlag(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	code := run([]string{"--version"})
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if code != 0 || !strings.HasPrefix(string(out), "sandboxd ") || !strings.Contains(string(out), "revision ") || !strings.Contains(string(out), "built with go") {
		t.Fatalf("sandboxd --version: exit %d, %q", code, out)
	}
}
