// Package browsertest runs a headless Chromium for tests of the dashboard,
// through the DevTools protocol (chromedp): Start launches Debian's
// chromium with a fresh profile in the test's temp dir and stops it at the
// end of the test, and the Browser it returns records every console error,
// uncaught exception and failed load the page reports.
//
// Without a chromium binary (apt-get install chromium) the test is skipped
// with the reason, unless SBX_REQUIRE_CHROMIUM=1 (set by CI), which turns
// the skip into a failure so CI can never pass by silently not running the
// browser tests.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"
)

// RequireEnv is the variable that turns skips into failures.
const RequireEnv = "SBX_REQUIRE_CHROMIUM"

// ArtifactsEnv names a directory screenshots are copied to as well (CI
// keeps it), beside the copy in the test's temp dir.
const ArtifactsEnv = "SBX_ARTIFACTS"

// binaries are where Debian's chromium package puts the browser: the
// binary itself first (the /usr/bin launcher is a shell script that only
// adds flags).
var binaries = []string{"/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome"}

// Unavailable skips t with the reason, or fails it when SBX_REQUIRE_CHROMIUM=1.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s (required: %s=1)", msg, RequireEnv)
	}
	t.Skip(msg)
}

// Browser is a running headless Chromium with one tab.
type Browser struct {
	// Ctx runs chromedp actions in the tab.
	Ctx context.Context

	mu     sync.Mutex
	errors []string
}

// Start launches Chromium (or skips t, see Unavailable); it is stopped in
// t.Cleanup.
func Start(t testing.TB) *Browser {
	t.Helper()
	path := ""
	for _, b := range binaries {
		if p, err := exec.LookPath(b); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		Unavailable(t, "browsertest: no chromium binary (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(filepath.Join(t.TempDir(), "profile")),
		chromedp.WindowSize(1400, 1100),
		chromedp.DisableGPU,
	)
	if os.Geteuid() == 0 {
		// Chromium refuses to run as root with its sandbox.
		opts = append(opts, chromedp.NoSandbox)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	b := &Browser{Ctx: ctx}
	// The first action starts the browser; Console subscribes from then on.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		Unavailable(t, "browsertest: start %s: %v", path, err)
	}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return // the tab ended
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.record("%s", m.String())
			}
		}
	}()
	t.Cleanup(func() { cancelTab(); <-done })
	return b
}

func (b *Browser) record(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errors = append(b.errors, fmt.Sprintf(format, args...))
}

// Errors returns what the page reported as errors so far.
func (b *Browser) Errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}

// Screenshot writes a PNG of the whole page to name in t's temp dir and,
// when SBX_ARTIFACTS names a directory, copies it there (as
// <test name>-<name>); it logs where and returns the temp dir's path.
func (b *Browser) Screenshot(t testing.TB, name string) string {
	t.Helper()
	png, err := chromedp.Run(b.Ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	if dir := os.Getenv(ArtifactsEnv); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		kept := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+name)
		if err := os.WriteFile(kept, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot kept: %s", kept)
	}
	return path
}
