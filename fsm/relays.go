package fsm

import (
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Relays are client connections spliced to a running claim's guest (the
// data plane: the agent, ports and exec routes). The state keeps the open
// ones so that the idle rule derives from the log: a claim with an open
// relay arms no idle-hibernate timer, and opening or closing one is
// activity. The bytes a relay carries never reach the log; its opening and
// its end do, once each.
//
// A relay is open only on a running claim whose VM is claimed: every
// decision that takes a claim out of that (hibernate, release, reap, a
// failure, a restart of its VM) closes the claim's relays first, in the
// same batch, with the reason. Relays do not survive the process that ran
// them, so a starting node closes every relay its log still holds open
// (CloseAllRelays, reason "restart").

// Relay kinds (RelayRec.Kind).
const (
	RelayAgent = "agent" // the guest agent's wire protocol
	RelayPort  = "port"  // a guest TCP port
	RelayExec  = "exec"  // a buffered exec
)

// Relay close reasons the state machine itself records; the API adds its
// own (client, guest, idle, error, shutdown).
const (
	RelayClosedRestart = "restart"
)

// MaxRelaysPerClaim bounds a claim's open relays, and so the state and the
// events one decision closes.
const MaxRelaysPerClaim = 4096

// maxRelayReason bounds a close reason.
const maxRelayReason = 64

// RelayRec is an open relay.
type RelayRec struct {
	ID    string
	Claim string
	Kind  string
	Port  int
	// Passive: an operator's relay, which holds the idle timer but is not
	// activity.
	Passive bool
	Opened  int64
}

// ValidRelayID reports whether id is "rl_" and 16 lowercase hex digits.
func ValidRelayID(id string) bool { return prefixedHex16(id, "rl_") }

// Relay returns open relay id's record.
func (s *State) Relay(id string) (RelayRec, bool) {
	r, ok := s.relays[id]
	if !ok {
		return RelayRec{}, false
	}
	return *r, true
}

// RelaysOf returns claim's open relay ids, sorted.
func (s *State) RelaysOf(claim string) []string { return slices.Clone(s.relaysOf[claim]) }

// OpenRelays returns the number of open relays.
func (s *State) OpenRelays() int { return len(s.relays) }

// hasRelays reports whether claim has an open relay (its idle timer is held).
func (s *State) hasRelays(claim string) bool { return len(s.relaysOf[claim]) > 0 }

func (s *State) addRelay(r *RelayRec) {
	s.relays[r.ID] = r
	ids := s.relaysOf[r.Claim]
	i, _ := slices.BinarySearch(ids, r.ID)
	s.relaysOf[r.Claim] = slices.Insert(ids, i, r.ID)
}

func (s *State) dropRelay(r *RelayRec) {
	delete(s.relays, r.ID)
	ids := s.relaysOf[r.Claim]
	if i, ok := slices.BinarySearch(ids, r.ID); ok {
		ids = slices.Delete(ids, i, i+1)
	}
	if len(ids) == 0 {
		delete(s.relaysOf, r.Claim)
		return
	}
	s.relaysOf[r.Claim] = ids
}

// OpenRelay records a relay opened to a running claim's guest. ID is
// minted by the caller; Port is the guest port of a RelayPort relay (0
// otherwise); Passive marks an operator's relay, which holds the claim's
// idle timer without counting as activity (opening or closing it).
type OpenRelay struct {
	Meta
	ID      string
	Claim   string
	Kind    string
	Port    int
	Passive bool
}

// CloseRelay records an open relay's end, with what it carried; closing a
// relay that is not open (the state closed it already) is a no-op.
type CloseRelay struct {
	Meta
	ID       string
	Reason   string
	BytesIn  int64
	BytesOut int64
}

// CloseAllRelays records every open relay closed with Reason: a starting
// node's, since relays do not survive the process that ran them.
type CloseAllRelays struct {
	Meta
	Reason string
}

// validRelayKind reports whether kind is a relay kind and port fits it.
func validRelayKind(kind string, port uint64) bool {
	switch kind {
	case RelayPort:
		return port >= 1 && port <= 65535
	case RelayAgent, RelayExec:
		return port == 0
	}
	return false
}

func checkRelayReason(r string) error {
	if r == "" || len(r) > maxRelayReason {
		return reject(Invalid, "relay close reason: 1 to %d bytes", maxRelayReason)
	}
	return nil
}

func (cmd OpenRelay) decide(d *decider) error {
	if !ValidRelayID(cmd.ID) {
		return reject(Invalid, "invalid relay id %q: want rl_ and 16 lowercase hex digits", cmd.ID)
	}
	if cmd.Port < 0 || !validRelayKind(cmd.Kind, uint64(cmd.Port)) {
		return reject(Invalid, "relay kind %q with port %d: want a port relay to a port in [1, 65535], or an agent or exec relay without one", cmd.Kind, cmd.Port)
	}
	if _, used := d.s.relays[cmd.ID]; used {
		return reject(Invalid, "relay id %s is already in use", cmd.ID)
	}
	c, err := d.liveClaim(cmd.Claim)
	if err != nil {
		return err
	}
	if c.Status != ClaimRunning {
		return reject(InvalidTransition, "sandbox %s is %s, not running", c.ID, c.Status)
	}
	if !runsGuest(d.s.vms[c.VM]) {
		return reject(InvalidTransition, "sandbox %s: its VM is not running", c.ID)
	}
	if n := len(d.s.relaysOf[c.ID]); n >= MaxRelaysPerClaim {
		return reject(TooMany, "sandbox %s has %d open relays, at most %d", c.ID, n, MaxRelaysPerClaim)
	}
	d.emit(event.RelayOpened{Relay: cmd.ID, Claim: c.ID, Kind: cmd.Kind, Port: cmd.Port, Passive: cmd.Passive}, c.ID)
	return nil
}

func (cmd CloseRelay) decide(d *decider) error {
	if err := checkRelayReason(cmd.Reason); err != nil {
		return err
	}
	if cmd.BytesIn < 0 || cmd.BytesOut < 0 {
		return reject(Invalid, "relay byte counts must not be negative")
	}
	r := d.s.relays[cmd.ID]
	if r == nil {
		return nil
	}
	d.emit(event.RelayClosed{Relay: r.ID, Claim: r.Claim, Reason: cmd.Reason, BytesIn: cmd.BytesIn, BytesOut: cmd.BytesOut}, r.Claim)
	return nil
}

func (cmd CloseAllRelays) decide(d *decider) error {
	if err := checkRelayReason(cmd.Reason); err != nil {
		return err
	}
	for _, claim := range sortedKeys(d.s.relaysOf) {
		d.closeRelays(claim, cmd.Reason)
	}
	return nil
}

// closeRelays closes claim's open relays with reason: what a decision that
// takes the claim out of running emits before its own events.
func (d *decider) closeRelays(claim, reason string) {
	for _, id := range d.s.relaysOf[claim] {
		d.emit(event.RelayClosed{Relay: id, Claim: claim, Reason: reason}, claim)
	}
}

func (a *applier) relayOpened(p event.RelayOpened) error {
	s := a.s
	if _, dup := s.relays[p.Relay]; dup || p.Relay == "" {
		return inconsistent("relay id %q already in use", p.Relay)
	}
	c, err := a.claim(p.Claim, ClaimRunning)
	if err != nil {
		return err
	}
	s.addRelay(&RelayRec{ID: p.Relay, Claim: c.ID, Kind: p.Kind, Port: p.Port, Passive: p.Passive, Opened: a.ev.Time})
	if !p.Passive {
		c.LastActivity = max(c.LastActivity, a.ev.Time)
	}
	s.syncClaimTimers(c)
	return nil
}

func (a *applier) relayClosed(p event.RelayClosed) error {
	s := a.s
	r := s.relays[p.Relay]
	if r == nil || r.Claim != p.Claim {
		return inconsistent("relay %s of claim %s is not open", p.Relay, p.Claim)
	}
	s.dropRelay(r)
	if c := s.claims[r.Claim]; c != nil && c.Status == ClaimRunning {
		// A client's relay ending is activity: with its last one, the idle
		// period starts from there. A passive one's end is not.
		if !r.Passive {
			c.LastActivity = max(c.LastActivity, a.ev.Time)
		}
		s.syncClaimTimers(c)
	}
	return nil
}

// checkRelays is Check's part for relays: each open relay belongs to a
// running claim whose VM is claimed, and the per-claim index lists exactly
// the open relays, sorted, within MaxRelaysPerClaim.
func (s *State) checkRelays(fail func(format string, args ...any)) {
	for _, id := range sortedKeys(s.relays) {
		r := s.relays[id]
		c := s.claims[r.Claim]
		switch {
		case r.ID != id || !ValidRelayID(id) || r.Port < 0 || !validRelayKind(r.Kind, uint64(r.Port)):
			fail("relay %s: record %+v", id, *r)
		case c == nil || c.Status != ClaimRunning:
			fail("relay %s: claim %s is not running", id, r.Claim)
		case !runsGuest(s.vms[c.VM]):
			fail("relay %s: the VM of claim %s is not claimed", id, r.Claim)
		}
		if _, found := slices.BinarySearch(s.relaysOf[r.Claim], id); !found {
			fail("relay %s: not in claim %s's index", id, r.Claim)
		}
	}
	n := 0
	for _, claim := range sortedKeys(s.relaysOf) {
		ids := s.relaysOf[claim]
		n += len(ids)
		if len(ids) == 0 || len(ids) > MaxRelaysPerClaim || !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
			fail("claim %s: relay index %v", claim, ids)
		}
	}
	if n != len(s.relays) {
		fail("relay index lists %d relays, %d are open", n, len(s.relays))
	}
}
