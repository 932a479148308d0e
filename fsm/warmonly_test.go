package fsm

import (
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// A WarmOnly claim takes a warm VM when the pool has one as it is decided,
// and is refused (TooMany, NoWarmMsg) rather than cloned when the last one
// went to a claim decided before it: the API then redirects it.
func TestWarmOnlyClaim(t *testing.T) {
	h := newHarness(t)
	h.setup(1)
	h.do(Claim{Meta: h.meta(), ID: claimID(1), Key: kA, WarmOnly: true}, event.TypeClaimCreated)
	if c, _ := h.s.Claim(claimID(1)); c.Tier != TierWarm {
		t.Fatalf("first claim tier %s, want warm", c.Tier)
	}
	r := h.rejects(Claim{Meta: h.meta(), ID: claimID(2), Key: kA, WarmOnly: true}, TooMany)
	if r.Msg != NoWarmMsg {
		t.Fatalf("rejection %q, want %q", r.Msg, NoWarmMsg)
	}
	if _, ok := h.s.Claim(claimID(2)); ok {
		t.Fatal("a refused WarmOnly claim left a record")
	}
	// Without WarmOnly the same claim is cloned, as before.
	h.do(Claim{Meta: h.meta(), ID: claimID(2), Key: kA}, event.TypeClaimCreated, event.TypeVMCloneRequested)
}
