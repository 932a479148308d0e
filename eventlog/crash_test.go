package eventlog

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// The crash test re-executes the test binary as a child (TestMain sees
// crashChildEnv) that appends from several writers until it is SIGKILLed. The
// child prints "ack <op id> <first seq> <count>" only after Append returned,
// so every printed line is a promise the log must keep after the kill.
const (
	crashChildEnv = "SBXLOG_EVENTLOG_CRASH_CHILD"
	crashNode     = "crash-node"
	crashWriters  = 6
)

// crashOpSize derives an op's event count from its id, so the parent can
// check an op is whole without being told what the child meant to write.
func crashOpSize(id event.OpID) int { return 1 + int(id[15]%4) }

// crashChild runs in the child process; it never returns normally.
func crashChild(dir string) int {
	l, err := Open(dir, Options{NodeID: crashNode})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		return 3
	}
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		// One write per line: a kill can cut the stream only between lines
		// or leave an unterminated last line, which the parent ignores.
		os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n")
	}
	say("ready %d", l.LastSeq())
	var wg sync.WaitGroup
	for w := range crashWriters {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(w)))
			var acked []AppendResult
			for i := 0; ; i++ {
				// Now and then retry an acknowledged op: it must come back as
				// the same events, with nothing written.
				if len(acked) > 0 && rng.IntN(8) == 0 {
					prev := acked[rng.IntN(len(acked))]
					res, err := l.Append(context.Background(), prev.Events)
					if err != nil || !res.Duplicate || res.Events[0].Seq != prev.Events[0].Seq {
						say("fail retry of %s: %+v %v", prev.Events[0].OpID, res, err)
						os.Exit(4)
					}
					continue
				}
				id := ulid.MustNew(ulid.Now(), ulid.DefaultEntropy())
				evs := mkEvents(id, crashOpSize(id), fmt.Sprintf("w%d-%d", w, i))
				res, err := l.Append(context.Background(), evs)
				if err != nil {
					say("fail append: %v", err)
					os.Exit(4)
				}
				say("ack %s %d %d", id, res.Events[0].Seq, len(res.Events))
				acked = append(acked, res)
			}
		})
	}
	wg.Wait()
	return 0
}

type crashAck struct{ first, count uint64 }

// runCrashChild starts a child, kills it after a random delay and returns the
// appends it acknowledged.
func runCrashChild(t *testing.T, dir string, rng *rand.Rand) map[event.OpID]crashAck {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// A few kills land before or during Open; most after appends started.
	if rng.IntN(10) == 0 {
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
	} else {
		select {
		case l, ok := <-lines:
			if !ok || !strings.HasPrefix(l, "ready") {
				_ = cmd.Process.Kill()
				t.Fatalf("child did not start: %q", l)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("child did not report ready")
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	acks := map[event.OpID]crashAck{}
	for l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) == 4 && f[0] == "ack":
			id, err1 := ulid.ParseStrict(f[1])
			first, err2 := strconv.ParseUint(f[2], 10, 64)
			count, err3 := strconv.ParseUint(f[3], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil {
				t.Fatalf("bad ack line %q", l)
			}
			acks[id] = crashAck{first, count}
		case strings.HasPrefix(l, "fail"):
			t.Fatalf("child: %s", l)
		}
	}
	_ = cmd.Wait() // killed: the error is expected
	return acks
}

func TestCrashKillKeepsAcknowledgedAppends(t *testing.T) {
	kills := 50
	if s := os.Getenv("SBXLOG_CRASH_KILLS"); s != "" {
		kills, _ = strconv.Atoi(s)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	acked := map[event.OpID]crashAck{}
	start := time.Now()
	var lastSeq uint64
	childAcks := 0
	for k := range kills {
		for id, a := range runCrashChild(t, dir, rng) {
			acked[id] = a
			childAcks++
		}

		l, err := Open(dir, Options{NodeID: crashNode})
		if err != nil {
			t.Fatalf("kill %d: reopen: %v", k, err)
		}
		// Every record decodes with its checksum, sequences are contiguous
		// and every op is whole (Verify), each op has the size its id says,
		// and every acknowledged op is there at its acknowledged sequence.
		if _, err := l.Verify(); err != nil {
			t.Fatalf("kill %d: %v", k, err)
		}
		ops := map[event.OpID]crashAck{}
		err = l.Iterate(0, 0, func(e *event.Event) error {
			a := ops[e.OpID]
			if a.count == 0 {
				a.first = e.Seq
			}
			a.count++
			ops[e.OpID] = a
			return nil
		})
		if err != nil {
			t.Fatalf("kill %d: iterate: %v", k, err)
		}
		for id, a := range ops {
			if int(a.count) != crashOpSize(id) {
				t.Fatalf("kill %d: op %s has %d events, it was appended with %d", k, id, a.count, crashOpSize(id))
			}
		}
		for id, a := range acked {
			if got, ok := ops[id]; !ok || got != a {
				t.Fatalf("kill %d: acknowledged op %s at %d (+%d) recovered as %+v (present %v)", k, id, a.first, a.count, got, ok)
			}
		}
		if l.LastSeq() < lastSeq {
			t.Fatalf("kill %d: LastSeq went back from %d to %d", k, lastSeq, l.LastSeq())
		}
		// New appends work and continue the sequence.
		id := ulid.MustNew(ulid.Now(), ulid.DefaultEntropy())
		id[15] = 0 // a one-event op for crashOpSize
		res, err := l.Append(context.Background(), mkEvents(id, 1, "parent"))
		if err != nil || res.Events[0].Seq != sumCounts(ops)+1 || l.LastSeq() != res.Events[0].Seq {
			t.Fatalf("kill %d: append after recovery: %+v %v", k, res, err)
		}
		acked[id] = crashAck{res.Events[0].Seq, 1}
		lastSeq = l.LastSeq()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d kills, %d ops acknowledged by children, %d events in %s", kills, childAcks, lastSeq, time.Since(start).Round(time.Millisecond))
	if childAcks < kills {
		t.Fatalf("only %d ops acknowledged over %d runs: the children barely appended", childAcks, kills)
	}
}

func sumCounts(ops map[event.OpID]crashAck) uint64 {
	var n uint64
	for _, a := range ops {
		n += a.count
	}
	return n
}
