package usage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsembed/natstest"
	"github.com/sbxlog/sbxlog/eventlog/replication/repltest"
	"github.com/sbxlog/sbxlog/projections/usage"
)

// script is one claim's life and its hand-computed compute seconds.
type script struct {
	id, tier string
	steps    []step
	compute  float64
}

// scripts builds n claims with lives derived from their index. The expected
// compute time is worked out from the same numbers by hand arithmetic:
// start (create for warm, serve otherwise) to release, minus the hibernated
// interval when there is one.
func scripts(n int) []script {
	var out []script
	for i := range n {
		base := float64(i) // seconds after t0
		run := float64(10 + i%7*5)
		s := script{id: fmt.Sprintf("c%03d", i)}
		switch i % 3 {
		case 0: // warm, released
			s.tier = "warm"
			s.steps = []step{{"create", base}, {"renew", base + 1}, {"release", base + run}}
			s.compute = run
		case 1: // clone, served 0.5 s later, hibernated 4 s, reaped
			s.tier = "clone"
			s.steps = []step{{"create", base}, {"serve", base + 0.5}, {"hibernate", base + 2}, {"wake", base + 6}, {"reap", base + 0.5 + run}}
			s.compute = run - 4
		default: // warm, hibernated at the end, released while hibernated
			s.tier = "warm"
			s.steps = []step{{"create", base}, {"hibernate", base + 3}, {"release", base + run}}
			s.compute = 3
		}
		out = append(out, s)
	}
	return out
}

// crashing applies like the consumer, then fails every nth call after the
// records are durable: a crash between the write and the acknowledgement.
type crashing struct {
	*usage.Consumer
	every, calls int
}

var errCrash = errors.New("injected crash after apply")

func (c *crashing) Apply(ctx context.Context, evs []event.Event) error {
	if err := c.Consumer.Apply(ctx, evs); err != nil {
		return err
	}
	c.calls++
	if c.every > 0 && c.calls%c.every == 0 {
		return errCrash
	}
	return nil
}

// Acceptance 3: the usage consumer is restarted again and again (clean
// stops, crashes between write and ack, torn tails) while claims flow.
// The journal ends byte for byte equal to one written in a single pass, and
// every summary has the hand-computed compute seconds.
func TestUsageExactlyOnceAcrossRestarts(t *testing.T) {
	srv := natstest.Single(t)
	_, js := natstest.Connect(t, srv.ClientURL())
	l := repltest.OpenLog(t, "n1")
	repltest.Replicate(t, srv.ClientURL(), l)

	claims := scripts(90)
	var gen sync.WaitGroup
	gen.Add(1)
	go func() {
		defer gen.Done()
		// Round-robin: every claim advances one step per round, so lives
		// interleave in the log as they would on a node.
		evs := make([][]event.Event, len(claims))
		for i, s := range claims {
			evs[i] = events(t, s.id, s.tier, "acme", s.steps)
		}
		for round := 0; ; round++ {
			any := false
			for i := range claims {
				// Claim i starts at round i/10, so lives overlap.
				if stepN := round - i/10; stepN >= 0 && stepN < len(evs[i]) {
					any = true
					ev := evs[i][stepN]
					ev.OpID = repltest.NextOp()
					if _, err := l.Append(context.Background(), []event.Event{ev}); err != nil {
						t.Errorf("append: %v", err)
						return
					}
				}
			}
			if !any && round > len(claims)/10 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	path := filepath.Join(t.TempDir(), "usage.jsonl")
	genDone := make(chan struct{})
	go func() { gen.Wait(); close(genDone) }()
	restarts, crashes, torn := 0, 0, 0
	for round := 0; ; round++ {
		c, err := usage.Open(path, usage.Options{CheckpointEvery: 16})
		if err != nil {
			t.Fatalf("round %d: open: %v", round, err)
		}
		done := false
		select {
		case <-genDone:
			done = c.Position("n1") == l.LastSeq()
		default:
		}
		if done {
			_ = c.Close()
			break
		}
		h := &crashing{Consumer: c, every: []int{0, 2, 0, 3}[round%4]}
		f, err := feed.New(feed.Options{JS: js, Durable: "usage-n1", Nodes: []string{"n1"}, Batch: 8}, h)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(40+round%5*20)*time.Millisecond)
		err = f.Run(ctx)
		cancel()
		switch {
		case errors.Is(err, errCrash):
			crashes++
			// No Close: a crash leaves no checkpoint. Sometimes it also
			// leaves half a line of a write that never finished.
			if crashes%2 == 0 {
				fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = fh.WriteString(`{"t":"2026-09-01T00:00:00Z","ev":"cla`)
				fh.Close()
				torn++
			}
		case err != nil:
			t.Fatalf("round %d: feed: %v", round, err)
		default:
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			restarts++
		}
		if round > 200 {
			t.Fatalf("not caught up after %d rounds: position %d, log %d", round, c.Position("n1"), l.LastSeq())
		}
	}
	t.Logf("%d clean restarts, %d crashes (%d torn tails), %d events", restarts, crashes, torn, l.LastSeq())
	if crashes < 3 || restarts < 3 {
		t.Fatalf("too few restarts to mean anything: %d clean, %d crashes", restarts, crashes)
	}

	// The same log through one consumer in one pass.
	refPath := filepath.Join(t.TempDir(), "ref.jsonl")
	ref, err := usage.Open(refPath, usage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.Apply(context.Background(), repltest.LocalEvents(t, l)); err != nil {
		t.Fatal(err)
	}
	_ = ref.Close()
	got, _ := os.ReadFile(path)
	want, _ := os.ReadFile(refPath)
	if !bytes.Equal(got, want) {
		t.Fatalf("journal after restarts differs from a single pass (%d vs %d bytes)", len(got), len(want))
	}

	sums := summaries(readRecords(t, path))
	if len(sums) != len(claims) {
		t.Fatalf("%d summaries, want %d", len(sums), len(claims))
	}
	for _, s := range claims {
		if got := *sums[s.id].ComputeS; got != s.compute {
			t.Errorf("claim %s: compute_s %v, hand-computed %v", s.id, got, s.compute)
		}
	}
}
