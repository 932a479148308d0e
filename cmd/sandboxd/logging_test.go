package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
)

// On a terminal the log is zerolog's console format, elsewhere JSON; both
// write durations with their unit (issue 25 item 5: JSON on a TTY,
// "elapsed" a bare number of milliseconds).
func TestLoggerConsoleOnATerminal(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	zl := newLogger("info", tty)
	zl.Info().Dur("elapsed", 1500*time.Millisecond).Msg("state rebuilt")
	zl.Debug().Msg("not at info")
	line, err := bufio.NewReader(ptmx).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(line, "{") || !strings.Contains(line, "INF") || !strings.Contains(line, "state rebuilt") || !strings.Contains(line, "1.5s") {
		t.Fatalf("console line %q", line)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	zl = newLogger("", w)
	zl.Info().Dur("elapsed", 1500*time.Millisecond).Msg("state rebuilt")
	w.Close()
	var rec map[string]any
	if err := json.NewDecoder(r).Decode(&rec); err != nil {
		t.Fatal(err)
	}
	if rec["elapsed"] != "1.5s" || rec["level"] != "info" || rec["message"] != "state rebuilt" {
		t.Fatalf("JSON line %v", rec)
	}
}

// log_level, SBX_LOG_LEVEL and --log-level take the levels there are; any
// other is refused at start, naming them (it was silently info).
func TestLogLevelRefusedUnlessKnown(t *testing.T) {
	for _, tc := range []struct {
		level string
		ok    bool
	}{{"", true}, {"debug", true}, {"warn", true}, {"verbose", false}, {"INFO", false}} {
		cfg := defaultConfig()
		cfg.LogLevel = tc.level
		err := cfg.finish()
		if (err == nil) != tc.ok || (!tc.ok && !strings.Contains(err.Error(), `log_level "`+tc.level+`": want debug, info, warn, error`)) {
			t.Errorf("log_level %q: %v", tc.level, err)
		}
	}
	if code := run([]string{"--log-level", "verbose", "-data", t.TempDir()}); code != 2 {
		t.Fatalf("--log-level verbose: exit %d, want 2", code)
	}
	t.Setenv("SBX_LOG_LEVEL", "chatty")
	if code := run([]string{"-data", t.TempDir()}); code != 2 {
		t.Fatalf("SBX_LOG_LEVEL=chatty: exit %d, want 2", code)
	}
}

// sandboxd's own logger names no component, so a part that names its own
// (the reconcile, replication) says it once: a node started with it writes
// no line with a key twice (issue 25 item 5: "component" came twice).
func TestNodeLogKeysOnce(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan []string, 1)
	go func() {
		var got []string
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			got = append(got, sc.Text())
		}
		lines <- got
	}()
	n, err := nodetest.Start(nodetest.Options{Dir: t.TempDir(), RootToken: "root", Log: newLogger("info", w),
		Pools: []fsm.PoolSpec{{PoolKey: fsm.PoolKey{Template: "default", Net: "none", Size: "small"}, Warm: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	got := <-lines
	components := 0
	for _, l := range got {
		dec := json.NewDecoder(strings.NewReader(l))
		seen := map[string]bool{}
		var obj map[string]json.RawMessage
		if err := dec.Decode(&obj); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		// Decode keeps the last of duplicate keys: count them in the text.
		for k := range obj {
			if strings.Count(l, `"`+k+`":`) > 1 && !seen[k] {
				t.Errorf("key %q twice in %s", k, l)
			}
			seen[k] = true
		}
		if _, ok := obj["component"]; ok {
			components++
		}
	}
	if len(got) < 3 || components == 0 {
		t.Fatalf("%d lines, %d with a component: the start-up's lines were not seen", len(got), components)
	}
}
