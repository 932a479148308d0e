package fsm

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

func relayID(n int) string { return fmt.Sprintf("rl_%016x", n) }

// idleSetup is a node with pool kA (idle hibernation after 60 s) and one
// running warm claim.
func idleSetup(h *harness) ClaimRec {
	h.node()
	h.pools(PoolSpec{PoolKey: kA, Warm: 2, IdleHibernateSeconds: 60})
	h.goldenReady(kA)
	h.fill(kA)
	return h.claimWarm(1, kA)
}

func (h *harness) openRelay(n int, claim string) {
	h.t.Helper()
	h.do(OpenRelay{Meta: h.meta(), ID: relayID(n), Claim: claim, Kind: RelayAgent}, event.TypeRelayOpened)
}

// relayReasons returns the reasons of the relay_closed events in evs.
func relayReasons(t *testing.T, evs []event.Event) []string {
	var out []string
	for i := range evs {
		if evs[i].Type == event.TypeRelayClosed {
			out = append(out, payload[event.RelayClosed](t, evs, i).Reason)
		}
	}
	return out
}

func TestRelayTransitions(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"an open relay holds the idle clock; its end restarts it", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			h.advance(30 * second)
			h.openRelay(1, c.ID)
			if cl := h.claim(c.ID); cl.LastActivity != h.now {
				t.Fatalf("opening is activity: last activity %d, want %d", cl.LastActivity, h.now)
			}
			if _, armed := h.s.timers.get(timerKey{kind: tIdle, id: c.ID}); armed {
				t.Fatal("idle timer armed while a relay is open")
			}
			h.advance(3600 * second)
			h.do(Tick{Meta: h.meta()}, event.TypeRelayClosed, event.TypeClaimExpired, event.TypeVMDestroyRequested)
		}},
		{"idle hibernation waits for the last relay's end", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			h.openRelay(1, c.ID)
			h.openRelay(2, c.ID)
			h.advance(90 * second)
			h.do(Tick{Meta: h.meta()})
			h.do(CloseRelay{Meta: h.meta(), ID: relayID(1), Reason: "client"}, event.TypeRelayClosed)
			h.advance(90 * second)
			h.do(Tick{Meta: h.meta()})
			evs := h.do(CloseRelay{Meta: h.meta(), ID: relayID(2), Reason: "guest", BytesIn: 5, BytesOut: 7}, event.TypeRelayClosed)
			if p := payload[event.RelayClosed](t, evs, 0); p != (event.RelayClosed{Relay: relayID(2), Claim: c.ID, Reason: "guest", BytesIn: 5, BytesOut: 7}) {
				t.Fatalf("%+v", p)
			}
			if at, _ := h.s.timers.get(timerKey{kind: tIdle, id: c.ID}); at != h.now+60*second {
				t.Fatalf("idle timer at %d, want %d", at, h.now+60*second)
			}
			h.advance(59 * second)
			h.do(Tick{Meta: h.meta()})
			h.advance(second)
			h.do(Tick{Meta: h.meta()}, event.TypeHibernateRequested)
		}},
		{"a passive relay holds the idle clock without being activity", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			opened := h.claim(c.ID).LastActivity
			h.advance(30 * second)
			h.do(OpenRelay{Meta: h.meta(), ID: relayID(1), Claim: c.ID, Kind: RelayPort, Port: 9100, Passive: true}, event.TypeRelayOpened)
			h.advance(60 * second)
			h.do(Tick{Meta: h.meta()})
			h.do(CloseRelay{Meta: h.meta(), ID: relayID(1), Reason: "client"}, event.TypeRelayClosed)
			if cl := h.claim(c.ID); cl.LastActivity != opened {
				t.Fatalf("last activity %d, want %d (untouched)", cl.LastActivity, opened)
			}
			// Its idle period ran out while the relay held it: due now.
			h.do(Tick{Meta: h.meta()}, event.TypeHibernateRequested)
		}},
		{"closing a relay that is not open is a no-op", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			h.openRelay(1, c.ID)
			h.do(CloseRelay{Meta: h.meta(), ID: relayID(1), Reason: "client"}, event.TypeRelayClosed)
			h.do(CloseRelay{Meta: h.meta(), ID: relayID(1), Reason: "client"})
			h.do(CloseRelay{Meta: h.meta(), ID: relayID(9), Reason: "client"})
		}},
		{"release closes the claim's relays first", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			h.openRelay(2, c.ID)
			h.openRelay(1, c.ID)
			evs := h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeRelayClosed, event.TypeRelayClosed, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			if r := relayReasons(t, evs); !slices.Equal(r, []string{"released", "released"}) {
				t.Fatalf("reasons %v", r)
			}
			if payload[event.RelayClosed](t, evs, 0).Relay != relayID(1) {
				t.Fatal("relays not closed in id order")
			}
			if h.s.OpenRelays() != 0 || len(h.s.RelaysOf(c.ID)) != 0 {
				t.Fatal("relays left open")
			}
		}},
		{"hibernate closes the claim's relays", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			h.openRelay(1, c.ID)
			evs := h.do(Hibernate{Meta: h.meta(), Claim: c.ID}, event.TypeRelayClosed, event.TypeHibernateRequested)
			if r := relayReasons(t, evs); !slices.Equal(r, []string{"hibernate"}) {
				t.Fatalf("reasons %v", r)
			}
		}},
		{"a VMM exit closes the relays of its claim", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			h.openRelay(1, c.ID)
			evs := h.do(VMExited{Meta: h.meta(), VM: c.VM, Restart: DefaultRestartPolicy}, event.TypeVMExited, event.TypeRelayClosed, event.TypeVMRestartRequested)
			if r := relayReasons(t, evs); !slices.Equal(r, []string{"vm_exited"}) {
				t.Fatalf("reasons %v", r)
			}
			h.rejects(OpenRelay{Meta: h.meta(), ID: relayID(2), Claim: c.ID, Kind: RelayAgent}, InvalidTransition)
		}},
		{"close all relays closes every claim's", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			c2 := h.claimWarm(2, kA)
			h.openRelay(3, c2.ID)
			h.openRelay(1, c.ID)
			h.do(OpenRelay{Meta: h.meta(), ID: relayID(2), Claim: c2.ID, Kind: RelayPort, Port: 8080}, event.TypeRelayOpened)
			if r, _ := h.s.Relay(relayID(2)); r != (RelayRec{ID: relayID(2), Claim: c2.ID, Kind: RelayPort, Port: 8080, Opened: h.now}) {
				t.Fatalf("relay %+v", r)
			}
			evs := h.do(CloseAllRelays{Meta: h.meta(), Reason: RelayClosedRestart}, event.TypeRelayClosed, event.TypeRelayClosed, event.TypeRelayClosed)
			var got []string
			for i := range evs {
				p := payload[event.RelayClosed](t, evs, i)
				if p.Reason != RelayClosedRestart || evs[i].AggID != p.Claim {
					t.Fatalf("%+v on %s", p, evs[i].AggID)
				}
				got = append(got, p.Claim+"/"+p.Relay)
			}
			if want := []string{c.ID + "/" + relayID(1), c2.ID + "/" + relayID(2), c2.ID + "/" + relayID(3)}; !slices.Equal(got, want) {
				t.Fatalf("closed %v, want %v", got, want)
			}
			h.do(CloseAllRelays{Meta: h.meta(), Reason: RelayClosedRestart})
		}},
		{"relays open only on running claims", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			h.rejects(OpenRelay{Meta: h.meta(), ID: relayID(1), Claim: claimID(9), Kind: RelayAgent}, NotFound)
			h.hibernate(c.ID)
			h.rejects(OpenRelay{Meta: h.meta(), ID: relayID(1), Claim: c.ID, Kind: RelayAgent}, InvalidTransition)
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased, event.TypeVMDestroyRequested)
			h.rejects(OpenRelay{Meta: h.meta(), ID: relayID(1), Claim: c.ID, Kind: RelayAgent}, InvalidTransition)
		}},
		{"malformed relays are refused", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			h.openRelay(1, c.ID)
			for _, cmd := range []Command{
				OpenRelay{Meta: h.meta(), ID: "rl_0123", Claim: c.ID, Kind: RelayAgent},
				OpenRelay{Meta: h.meta(), ID: relayID(1), Claim: c.ID, Kind: RelayAgent},
				OpenRelay{Meta: h.meta(), ID: relayID(2), Claim: c.ID, Kind: "ssh"},
				OpenRelay{Meta: h.meta(), ID: relayID(2), Claim: c.ID, Kind: RelayPort},
				OpenRelay{Meta: h.meta(), ID: relayID(2), Claim: c.ID, Kind: RelayPort, Port: 65536},
				OpenRelay{Meta: h.meta(), ID: relayID(2), Claim: c.ID, Kind: RelayAgent, Port: 22},
				OpenRelay{Meta: h.meta(), ID: relayID(2), Claim: c.ID, Kind: RelayExec, Port: -1},
				CloseRelay{Meta: h.meta(), ID: relayID(1)},
				CloseRelay{Meta: h.meta(), ID: relayID(1), Reason: "client", BytesIn: -1},
				CloseAllRelays{Meta: h.meta()},
			} {
				h.rejects(cmd, Invalid)
			}
		}},
		{"a claim's open relays are bounded", func(t *testing.T, h *harness) {
			c := idleSetup(h)
			for i := range MaxRelaysPerClaim {
				evs, err := Decide(h.s, OpenRelay{Meta: h.meta(), ID: relayID(i), Claim: c.ID, Kind: RelayExec})
				if err != nil || len(evs) != 1 || Apply(h.s, &evs[0]) != nil {
					t.Fatalf("relay %d: %v", i, err)
				}
			}
			h.rejects(OpenRelay{Meta: h.meta(), ID: relayID(MaxRelaysPerClaim), Claim: c.ID, Kind: RelayExec}, TooMany)
			if err := h.s.Check(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newHarness(t)) })
	}
}

// The relay invariants are checked: a relay of a claim that is not running
// fails Check.
func TestCheckRelays(t *testing.T) {
	h := newHarness(t)
	c := idleSetup(h)
	h.openRelay(1, c.ID)
	h.s.claims[c.ID].Status = ClaimHibernated // behind the indexes' back
	if err := h.s.Check(); err == nil {
		t.Fatal("Check accepted a relay on a claim that is not running")
	}
}

func TestRelaysAreEncoded(t *testing.T) {
	h := richState(t)
	if h.s.OpenRelays() == 0 {
		t.Fatal("richState has no open relay")
	}
	back, err := Decode(Encode(h.s))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range h.s.ClaimIDs() {
		if !slices.Equal(back.RelaysOf(id), h.s.RelaysOf(id)) {
			t.Fatalf("claim %s: relays %v after decode, want %v", id, back.RelaysOf(id), h.s.RelaysOf(id))
		}
		for _, r := range h.s.RelaysOf(id) {
			a, _ := h.s.Relay(r)
			b, _ := back.Relay(r)
			if a != b {
				t.Fatalf("relay %+v after decode, want %+v", b, a)
			}
		}
	}
	saved := Encode(h.s)
	for _, r := range h.s.relays { //fsm:unordered one mutation is enough
		r.Port++
		break
	}
	if bytes.Equal(Encode(h.s), saved) {
		t.Fatal("relays not part of the encoding")
	}
}
