package fsm

import (
	"reflect"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// DecidePayloads' payloads must be what the log will hold (ApplyDecoded
// relies on it), also for text the JSON codec changes: invalid UTF-8 comes
// back as U+FFFD, so such payloads are handed out decoded.
func TestDecidePayloadsMatchTheLog(t *testing.T) {
	cutRune := strings.Repeat("x", MaxErrorText-1) + "é tail" // é is 2 bytes: errText cuts it in half
	cases := []struct {
		name string
		cmd  func(h *harness) Command
	}{
		{"plain claim", func(h *harness) Command {
			return Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Metadata: map[string]string{"team": "<a&b>\u2028"}}
		}},
		{"claim metadata with invalid UTF-8", func(h *harness) Command {
			return Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Metadata: map[string]string{"k": "bad \xff byte"}, ClaimRef: "ref\xc3"}
		}},
		{"claim metadata with U+FFFD already", func(h *harness) Command {
			return Claim{Meta: h.meta(), ID: claimID(1), Key: kA, Metadata: map[string]string{"k": "\uFFFD"}}
		}},
		{"clone failure with an error cut mid-rune", func(h *harness) Command {
			evs := h.do(Refill{Meta: h.meta(), Key: kA}, event.TypeVMCloneRequested)
			vm := evs[0].AggID
			return VMCloneFailed{Meta: h.res(h.intentFor(vm, kA)), VM: vm, Error: cutRune}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.node()
			h.pools(PoolSpec{PoolKey: kA, Warm: 1})
			h.goldenReady(kA)
			cmd := tc.cmd(h)
			replayed, err := Decode(Encode(h.s))
			if err != nil {
				t.Fatal(err)
			}
			evs, ps, err := DecidePayloads(h.s, cmd)
			if err != nil || len(evs) == 0 || len(ps) != len(evs) {
				t.Fatalf("DecidePayloads = %d events, %d payloads, %v", len(evs), len(ps), err)
			}
			for i := range evs {
				stored, err := event.Decode(event.Encode(&evs[i]))
				if err != nil {
					t.Fatal(err)
				}
				back, err := stored.Decode()
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(back, ps[i]) {
					t.Fatalf("%s: payload handed out %#v, log holds %#v", evs[i].Type, ps[i], back)
				}
				if err := ApplyDecoded(h.s, &evs[i], ps[i]); err != nil {
					t.Fatal(err)
				}
				if err := Apply(replayed, &stored); err != nil {
					t.Fatal(err)
				}
			}
			if HashHex(h.s) != HashHex(replayed) {
				t.Fatal("state applied from the payloads as built differs from the state replayed from the log")
			}
		})
	}
}

// ApplyDecoded refuses a payload of another event's type and leaves the
// state alone.
func TestApplyDecodedRefusesAForeignPayload(t *testing.T) {
	h := newHarness(t)
	h.node()
	h.pools(PoolSpec{PoolKey: kA, Warm: 1})
	h.goldenReady(kA)
	evs, _, err := DecidePayloads(h.s, Refill{Meta: h.meta(), Key: kA})
	if err != nil || len(evs) == 0 {
		t.Fatalf("Refill decided %d events, %v", len(evs), err)
	}
	before := HashHex(h.s)
	for _, p := range []event.Payload{nil, event.ClaimReleased{Claim: claimID(1)}} {
		if err := ApplyDecoded(h.s, &evs[0], p); err == nil {
			t.Fatalf("ApplyDecoded(%s, %T) succeeded", evs[0].Type, p)
		}
	}
	if HashHex(h.s) != before {
		t.Fatal("a refused ApplyDecoded changed the state")
	}
}
