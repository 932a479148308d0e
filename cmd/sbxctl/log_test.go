package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
)

// writeLog makes a log of n one-event ops (claim_served, claim c<i>) and
// returns its directory.
func writeLog(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	l, err := eventlog.Open(dir, eventlog.Options{NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 1; i <= n; i++ {
		ev, err := event.New(event.ClaimServed{Claim: fmt.Sprintf("c%d", i), VM: "vm1"}, fmt.Sprintf("c%d", i),
			event.OpIDFromUint(1_700_000_000_000, uint64(i)), event.ZeroOpID, int64(i)*1e9)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(context.Background(), []event.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func run(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = dispatch(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestLogDumpTable(t *testing.T) {
	dir := writeLog(t, 5)
	code, out, errs := run("log", "dump", "--data", dir, "--from", "2", "--limit", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SEQ") {
		t.Fatalf("want a header and 2 rows, got:\n%s", out)
	}
	want := []string{"2", "1970-01-01T00:00:02Z", "claim_served", "claim/c2", event.OpIDFromUint(1_700_000_000_000, 2).String()}
	if got := strings.Fields(lines[1]); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("row 1 = %v, want %v", got, want)
	}
	if got := strings.Fields(lines[2]); got[0] != "3" {
		t.Fatalf("row 2 = %v, want seq 3", got)
	}
}

func TestLogDumpJSON(t *testing.T) {
	dir := writeLog(t, 3)
	code, out, errs := run("log", "dump", "--data", dir, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 JSON lines, got:\n%s", out)
	}
	for i, line := range lines {
		var got struct {
			Seq     uint64
			Node    string
			Type    string
			AggID   string `json:"agg_id"`
			OpID    string `json:"op_id"`
			Payload event.ClaimServed
		}
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
		c := fmt.Sprintf("c%d", i+1)
		if got.Seq != uint64(i+1) || got.Node != "n1" || got.Type != "claim_served" || got.AggID != c ||
			got.Payload != (event.ClaimServed{Claim: c, VM: "vm1"}) || got.OpID != event.OpIDFromUint(1_700_000_000_000, uint64(i+1)).String() {
			t.Fatalf("line %d decoded to %+v", i, got)
		}
	}
}

func TestLogVerify(t *testing.T) {
	dir := writeLog(t, 6)
	code, out, errs := run("log", "verify", "--data", dir)
	if code != 0 || !strings.Contains(out, "OK: node n1, seqs 1..6, 6 events") {
		t.Fatalf("healthy log: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	// Flip a payload byte of seq 4 through Pebble directly.
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	rec, closer, err := db.Get(eventlog.EventKey(4))
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(rec)
	closer.Close()
	bad[len(bad)-3] ^= 0x20
	if err := db.Set(eventlog.EventKey(4), bad, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	code, out, _ = run("log", "verify", "--data", dir)
	if code != 1 || !strings.Contains(out, "first bad sequence 4") || !strings.Contains(out, "checksum") {
		t.Fatalf("corrupt log: exit %d, stdout %q", code, out)
	}
	// dump stops at the bad record with an error naming it.
	code, out, errs = run("log", "dump", "--data", dir)
	if code != 1 || !strings.Contains(errs, "seq 4") || strings.Count(out, "claim_served") != 3 {
		t.Fatalf("dump of a corrupt log: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestLogCommandsBadInput(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"log", "verify", "--data", "/nonexistent/sbxlog"}, 1, "no log in /nonexistent/sbxlog"},
		{[]string{"log", "dump", "--data", "/nonexistent/sbxlog"}, 1, "no log in"},
		{[]string{"log", "dump", "--from", "x"}, 2, "invalid value"},
		{[]string{"log", "verify", "extra"}, 2, "unexpected argument"},
		{[]string{"log", "dump", "-h"}, 0, "-json"},
	}
	for _, tc := range tests {
		code, _, errs := run(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.stderr) {
			t.Errorf("%v: exit %d stderr %q; want %d containing %q", tc.args, code, errs, tc.code, tc.stderr)
		}
	}
}

// quietLogger keeps Pebble's recovery chatter out of the test output.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
