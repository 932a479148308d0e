package usage_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/projections/usage"
)

// Egress usage becomes egress_bytes records, one per usage event, whether
// it comes before the claim's summary or after it (the final one, written
// when the sandbox's proxy closed after the release).
func TestEgressBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.jsonl")
	c, err := usage.Open(path, usage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	claim := "sb_00000000000000e1"
	evs := events(t, claim, "warm", "acme", []step{{"create", 0}})
	u := func(at float64, tx, rx int64, final bool) event.Event {
		ev, err := event.New(event.EgressUsage{Claim: claim, Key: &key, Tenant: "acme", FromNS: t0, ToNS: t0 + int64(at)*sec,
			Tx: tx, Rx: rx, Allowed: 7, Denied: 1, Final: final}, claim, event.OpIDFromUint(uint64(at), 99), event.ZeroOpID, t0+int64(at)*sec)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	evs = append(evs, u(60, 100, 2000, false))
	evs = append(evs, events(t, claim, "warm", "acme", []step{{"release", 90}})...)
	evs = append(evs, u(91, 5, 6, true))
	if err := c.Apply(context.Background(), sequence("n1", 1, evs)); err != nil {
		t.Fatal(err)
	}
	var got []usage.Record
	for _, r := range readRecords(t, path) {
		if r.Ev == usage.EvEgress {
			got = append(got, r)
		}
	}
	if len(got) != 2 {
		t.Fatalf("%d egress records: %+v", len(got), got)
	}
	a, b := got[0], got[1]
	if a.ID != claim || a.Tenant != "acme" || a.Key != key.String() || a.Tx != 100 || a.Rx != 2000 || a.Allowed != 7 || a.Denied != 1 || a.Final ||
		a.Start != "2026-09-01T00:00:00Z" || a.End != "2026-09-01T00:01:00Z" {
		t.Fatalf("first record %+v", a)
	}
	if b.Tx != 5 || !b.Final || b.Key != key.String() {
		t.Fatalf("final record %+v", b)
	}
	if len(c.Open()) != 0 {
		t.Fatalf("open sandboxes %+v", c.Open())
	}
}
