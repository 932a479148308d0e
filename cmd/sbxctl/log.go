package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
)

// defaultLogDir is sandboxd's default data dir (make run's ./data);
// $SBXLOG_DATA overrides it for every log command. --data takes either a
// daemon's data dir (its op log is <data>/log) or the op log dir itself.
const defaultLogDir = "data"

// logDirOf resolves --data: a daemon data dir holds its op log in log/.
func logDirOf(dir string) string {
	if fi, err := os.Stat(filepath.Join(dir, "log")); err == nil && fi.IsDir() {
		return filepath.Join(dir, "log")
	}
	return dir
}

func init() {
	register("log dump", command{summary: "print op log events (table or JSON lines)", examples: `sbxctl log dump --data ./data
sbxctl log dump --data ./data --json | head`, run: logCommand("log dump", dumpFlags)})
	register("log verify", command{summary: "check an op log's contiguity, checksums and op index", examples: `sbxctl log verify --data ./data`, run: logCommand("log verify", verifyFlags)})
}

// logBody runs a log command against the opened log; it returns the exit code.
type logBody func(l *eventlog.Log, stdout, stderr io.Writer) int

// logCommand builds a "log ..." command: it parses --data plus the flags
// addFlags defines, opens the log read-only (the tools never change a log,
// and need not know its node id) and runs the body addFlags returned.
func logCommand(name string, addFlags func(*flag.FlagSet) logBody) func(args []string, stdout, stderr io.Writer) int {
	return func(args []string, stdout, stderr io.Writer) int {
		fs := flag.NewFlagSet("sbxctl "+name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		dir := defaultLogDir
		if env := os.Getenv("SBXLOG_DATA"); env != "" {
			dir = env
		}
		data := fs.String("data", dir, "op log directory ($SBXLOG_DATA)")
		body := addFlags(fs)
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "sbxctl %s: unexpected argument %q\n", name, fs.Arg(0))
			return 2
		}
		l, err := eventlog.Open(logDirOf(*data), eventlog.Options{ReadOnly: true})
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl: %v\n", err)
			return 1
		}
		defer l.Close()
		return body(l, stdout, stderr)
	}
}

func dumpFlags(fs *flag.FlagSet) logBody {
	from := fs.Uint64("from", 0, "first sequence to print (0: the oldest retained)")
	limit := fs.Uint64("limit", 0, "print at most this many events (0: all)")
	asJSON := fs.Bool("json", false, "one JSON object per line, payload as JSON")
	return func(l *eventlog.Log, stdout, stderr io.Writer) int {
		var until uint64
		if *limit > 0 {
			until = max(*from, l.FirstSeq()) + *limit - 1
		}
		var write func(*event.Event) error
		flush := func() error { return nil }
		if *asJSON {
			enc := json.NewEncoder(stdout)
			write = func(e *event.Event) error { return enc.Encode(dumpJSON(e)) }
		} else {
			tw := newTable(stdout, "SEQ\tTIME\tTYPE\tAGGREGATE\tOP ID")
			write = func(e *event.Event) error {
				_, err := fmt.Fprintf(tw, "%d\t%s\t%s\t%s/%s\t%s\n", e.Seq, formatTime(e.Time), e.Type, e.AggKind, e.AggID, e.OpID)
				return err
			}
			flush = tw.Flush
		}
		err := l.Iterate(*from, until, write)
		if ferr := flush(); err == nil {
			err = ferr
		}
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl: log dump: %v\n", err)
			return 1
		}
		return 0
	}
}

func formatTime(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// eventJSON is the dump's line format: the envelope with readable names and
// the payload inline (it is JSON already; a payload that is not is given as
// base64 in payload_b64 instead).
type eventJSON struct {
	Seq        uint64          `json:"seq"`
	Node       string          `json:"node"`
	Time       string          `json:"time"`
	TimeNs     int64           `json:"time_ns"`
	Type       string          `json:"type"`
	Version    uint16          `json:"version"`
	AggKind    string          `json:"agg_kind"`
	AggID      string          `json:"agg_id"`
	OpID       string          `json:"op_id"`
	Causation  string          `json:"causation,omitempty"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	PayloadB64 string          `json:"payload_b64,omitempty"`
}

func dumpJSON(e *event.Event) eventJSON {
	j := eventJSON{
		Seq: e.Seq, Node: e.Node, Time: formatTime(e.Time), TimeNs: e.Time,
		Type: e.Type.String(), Version: e.Version, AggKind: e.AggKind.String(), AggID: e.AggID,
		OpID: e.OpID.String(),
	}
	if e.Causation != event.ZeroOpID {
		j.Causation = e.Causation.String()
	}
	switch {
	case len(e.Payload) == 0:
	case json.Valid(e.Payload):
		j.Payload = json.RawMessage(e.Payload)
	default:
		j.PayloadB64 = base64.StdEncoding.EncodeToString(e.Payload)
	}
	return j
}

func verifyFlags(*flag.FlagSet) logBody {
	return func(l *eventlog.Log, stdout, stderr io.Writer) int {
		rep, err := l.Verify()
		if err != nil {
			var ce *eventlog.CorruptError
			if errors.As(err, &ce) {
				fmt.Fprintf(stdout, "FAIL: first bad sequence %d: %v\n", ce.Seq, ce.Err)
			} else {
				fmt.Fprintf(stderr, "sbxctl: log verify: %v\n", err)
			}
			return 1
		}
		fmt.Fprintf(stdout, "OK: node %s, seqs %d..%d, %d events, %d op-index entries, %d snapshots\n",
			l.NodeID(), rep.First, rep.Last, rep.Events, rep.Ops, rep.Snapshots)
		return 0
	}
}
