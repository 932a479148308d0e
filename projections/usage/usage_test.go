package usage_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/projections/usage"
)

const sec = int64(1_000_000_000)

// t0 is 2026-09-01T00:00:00Z.
const t0 = int64(1_788_220_800) * sec

var key = event.PoolKey{Template: "tpl", Net: "none", Size: "small"}

// lifecycle builds the events of one claim from a compact script: each step
// is a kind and a time in seconds after t0.
type step struct {
	kind string
	at   float64
}

func events(t *testing.T, claim, tier, tenant string, steps []step) []event.Event {
	t.Helper()
	vm := "vm-" + claim
	var out []event.Event
	for i, s := range steps {
		var p event.Payload
		switch s.kind {
		case "create":
			p = event.ClaimCreated{Claim: claim, Key: key, VM: vm, Tier: tier, Tenant: tenant, TTLSeconds: 600}
		case "serve":
			p = event.ClaimServed{Claim: claim, VM: vm}
		case "hibernate":
			p = event.Hibernated{Claim: claim, VM: vm, SnapshotDir: "snap"}
		case "wake":
			p = event.Woken{Claim: claim, VM: vm}
		case "renew":
			p = event.ClaimRenewed{Claim: claim, TTLSeconds: 900}
		case "release":
			p = event.ClaimReleased{Claim: claim, VM: vm}
		case "reap":
			p = event.ClaimExpired{Claim: claim, VM: vm}
		case "fail":
			p = event.ClaimFailed{Claim: claim, VM: vm, Reason: "wake_failed"}
		case "touch": // irrelevant to usage
			p = event.ClaimTouched{Claim: claim}
		default:
			t.Fatalf("bad step %q", s.kind)
		}
		ev, err := event.New(p, claim, event.OpIDFromUint(uint64(i+1), uint64(len(claim))), event.ZeroOpID, t0+int64(s.at*float64(sec)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// sequence stamps node and contiguous seqs, as the op log would.
func sequence(node string, from uint64, evs []event.Event) []event.Event {
	for i := range evs {
		evs[i].Node, evs[i].Seq = node, from+uint64(i)
	}
	return evs
}

func readRecords(t *testing.T, path string) []usage.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []usage.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r usage.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func summaries(recs []usage.Record) map[string]usage.Record {
	out := map[string]usage.Record{}
	for _, r := range recs {
		if r.Ev == usage.EvSummary {
			out[r.ID] = r
		}
	}
	return out
}

// Compute seconds for hand-worked lifecycles: claim to end minus every
// hibernate-to-wake interval; a pending claim that fails never computes.
func TestComputeSecondsByHand(t *testing.T) {
	cases := []struct {
		claim, tier string
		steps       []step
		// hand-computed
		compute, hibernated, wall float64
		hibernations              int
		endEv                     string
	}{
		{"a", "warm", []step{{"create", 100}, {"hibernate", 160}, {"wake", 200}, {"touch", 210}, {"hibernate", 250}, {"wake", 260}, {"renew", 300}, {"release", 400}},
			300 - 40 - 10, 50, 300, 2, usage.EvRelease},
		{"b", "clone", []step{{"create", 100}, {"serve", 102.5}, {"reap", 302.5}},
			200, 0, 200, 0, usage.EvReap},
		{"c", "cold", []step{{"create", 110}, {"fail", 130}},
			0, 0, 0, 0, usage.EvFail},
		{"d", "warm", []step{{"create", 120}, {"hibernate", 150}, {"fail", 500}},
			30, 350, 380, 1, usage.EvFail},
	}
	path := filepath.Join(t.TempDir(), "usage.jsonl")
	c, err := usage.Open(path, usage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(1)
	for _, tc := range cases {
		evs := sequence("n1", seq, events(t, tc.claim, tc.tier, "acme", tc.steps))
		seq += uint64(len(evs))
		// Apply one event at a time and reopen half-way through each claim,
		// so open sandboxes also come back from the journal.
		for i := range evs {
			if err := c.Apply(context.Background(), evs[i:i+1]); err != nil {
				t.Fatal(err)
			}
			if i == len(evs)/2 {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				if c, err = usage.Open(path, usage.Options{CheckpointEvery: 3}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	open := events(t, "e", "warm", "", []step{{"create", 130}, {"hibernate", 140}})
	if err := c.Apply(context.Background(), sequence("n1", seq, open)); err != nil {
		t.Fatal(err)
	}
	if got := c.Open(); len(got) != 1 || got[0].ID != "e" || got[0].Hibernations != 1 {
		t.Fatalf("open sandboxes %+v", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	recs := readRecords(t, path)
	sums := summaries(recs)
	if len(sums) != len(cases) {
		t.Fatalf("%d summaries, want %d", len(sums), len(cases))
	}
	for _, tc := range cases {
		s := sums[tc.claim]
		if *s.ComputeS != tc.compute || *s.HibernatedS != tc.hibernated || *s.WallS != tc.wall ||
			s.Hibernations != tc.hibernations || s.EndEv != tc.endEv || s.Key != key.String() || s.Tenant != "acme" || s.VM != "vm-"+tc.claim {
			t.Errorf("claim %s summary %+v compute %v hib %v wall %v; want compute %v hib %v wall %v", tc.claim, s, *s.ComputeS, *s.HibernatedS, *s.WallS, tc.compute, tc.hibernated, tc.wall)
		}
	}
	// Every usage-relevant event has exactly one record, in log order, with
	// the old daemon's fields.
	var kinds []string
	for _, r := range recs {
		if r.ID == "a" {
			kinds = append(kinds, r.Ev)
		}
		if r.T == "" || r.Node != "n1" || r.Seq == 0 || r.Key == "" {
			t.Fatalf("record missing fields: %+v", r)
		}
	}
	want := []string{"claim", "hibernate", "wake", "hibernate", "wake", "renew", "release", "summary"}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("records of a: %v, want %v", kinds, want)
	}
	if recs[0].T != "2026-09-01T00:01:40Z" {
		t.Fatalf("t = %s", recs[0].T)
	}
}

// A crash between an end record and its summary (both from one event) is
// repaired at Open: the summary is written, once.
func TestRepairsLostSummary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.jsonl")
	c, err := usage.Open(path, usage.Options{CheckpointEvery: 1})
	if err != nil {
		t.Fatal(err)
	}
	evs := sequence("n1", 1, events(t, "a", "warm", "", []step{{"create", 0}, {"release", 61.25}}))
	if err := c.Apply(context.Background(), evs[:1]); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	if err := c.Apply(context.Background(), evs[1:]); err != nil {
		t.Fatal(err)
	}
	// Keep the release line, drop the summary line, as a torn write would.
	data, _ := os.ReadFile(path)
	nl := bytes.IndexByte(data[before.Size():], '\n')
	if nl < 0 || !bytes.Contains(data[before.Size():before.Size()+int64(nl)], []byte(`"ev":"release"`)) {
		t.Fatalf("unexpected journal tail %q", data[before.Size():])
	}
	if err := os.Truncate(path, before.Size()+int64(nl)+1); err != nil {
		t.Fatal(err)
	}
	// The checkpoint taken after the second Apply points past the cut:
	// remove it, as if the crash came before it.
	_ = os.Remove(path + ".ckpt")

	c2, err := usage.Open(path, usage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c2.Position("n1") != 2 || len(c2.Open()) != 0 {
		t.Fatalf("position %d open %+v", c2.Position("n1"), c2.Open())
	}
	_ = c2.Close()
	c3, err := usage.Open(path, usage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = c3.Close()
	recs := readRecords(t, path)
	if len(recs) != 3 || recs[2].Ev != usage.EvSummary || *recs[2].ComputeS != 61.25 {
		t.Fatalf("records after repair: %+v", recs)
	}
}
