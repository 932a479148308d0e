package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/relay"
)

// The data plane: the routes that reach a sandbox's guest (agent, ports,
// exec). Each connection to a guest is a relay, recorded in the op log when
// it opens and when it ends (fsm.OpenRelay, fsm.CloseRelay) and never per
// byte or frame; the state's open relays hold the sandbox's idle clock.
// The first relay to a hibernated sandbox wakes it and waits (bounded by
// Config.ClaimWait) until it runs. A decision that takes the sandbox out of
// running (release, reap, hibernate, a VMM exit) closes its relays in the
// log, and this process ends the connections when that commits.

// guestVM names the VM whose guest a relay reaches.
type guestVM struct {
	ID string
	// RunDir is the VM's run dir, relative to the runs root (fsm.VMRec.RunDir).
	RunDir string
}

// DataPlane configures the data-plane routes (Options.DataPlane).
type DataPlane struct {
	// Dialer reaches guests (the hypervisor driver; it must hand back the
	// raw connection, so that relays splice); nil: every data-plane route
	// answers 502.
	Dialer executors.AgentDialer
	// RelayIdle ends a relay through which nothing moved for that long
	// (default DefaultRelayIdle; negative: never).
	RelayIdle time.Duration
	// DialTimeout bounds reaching the guest agent (default 30 s).
	DialTimeout time.Duration
}

// DefaultRelayIdle is DataPlane.RelayIdle's default: far beyond the SDKs'
// idle keep-alive (30 s), so only a connection left open and forgotten is
// ended, and with it its hold on the sandbox's idle clock.
const DefaultRelayIdle = time.Hour

// shutdownWait bounds how long a stopping node waits for its relays to
// record their own ends (a stopped relay's client gets a second to see its
// FIN).
const shutdownWait = 3 * time.Second

// errGuestUnreachable is the old daemon's answer when the agent cannot be
// dialed.
const errGuestUnreachable = "guest agent unreachable"

type dataPlane struct {
	s    *Server
	opts DataPlane

	mu      sync.Mutex
	live    map[string]*liveRelay                 // relay id -> its connection
	waiters map[string]map[chan struct{}]struct{} // claim id -> woken on its events
	closing bool                                  // shut down: no new relays
	aborted bool                                  // crashed (Kill): record nothing more
	idle    *sync.Cond                            // signalled when live shrinks

	execBytes atomic.Int64 // buffered exec output held node-wide
}

func newDataPlane(s *Server, o DataPlane) *dataPlane {
	if o.RelayIdle == 0 {
		o.RelayIdle = DefaultRelayIdle
	}
	if o.RelayIdle < 0 {
		o.RelayIdle = 0
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 30 * time.Second
	}
	d := &dataPlane{s: s, opts: o, live: map[string]*liveRelay{}, waiters: map[string]map[chan struct{}]struct{}{}}
	d.idle = sync.NewCond(&d.mu)
	return d
}

// liveRelay is a relay this process runs, registered before its opening
// is proposed so that a close committed meanwhile is not missed.
type liveRelay struct {
	id, claim string

	mu     sync.Mutex
	reason string              // why it was stopped; "" while it runs
	stop   func(reason string) // ends the connection, once attached
}

// end stops the relay with reason (the first reason wins).
func (l *liveRelay) end(reason string) {
	l.mu.Lock()
	if l.reason == "" {
		l.reason = reason
	}
	stop := l.stop
	l.mu.Unlock()
	if stop != nil {
		stop(reason)
	}
}

// attach sets what ends the connection and returns the reason the relay
// was already stopped for, if it was.
func (l *liveRelay) attach(stop func(string)) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stop = stop
	return l.reason
}

// ErrDataPlaneClosed: sandboxd is shutting down and opens no relay.
var ErrDataPlaneClosed = errors.New("sandboxd is shutting down")

// errNoTransport: the node's hypervisor driver cannot reach guests.
var errNoTransport = fmt.Errorf("%w: this node's hypervisor driver has no guest transport", executors.ErrAgentUnreachable)

func (d *dataPlane) track(id, claim string) (*liveRelay, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrDataPlaneClosed)
	}
	l := &liveRelay{id: id, claim: claim}
	d.live[id] = l
	return l, nil
}

func (d *dataPlane) unregister(id string) (aborted bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.live, id)
	d.idle.Broadcast()
	return d.aborted
}

// watch returns a channel closed at the next commit about claim (or at
// shutdown); call the returned func when done with it.
func (d *dataPlane) watch(claim string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	d.mu.Lock()
	if d.waiters[claim] == nil {
		d.waiters[claim] = map[chan struct{}]struct{}{}
	}
	d.waiters[claim][ch] = struct{}{}
	d.mu.Unlock()
	return ch, func() {
		d.mu.Lock()
		if set := d.waiters[claim]; set != nil {
			if _, ok := set[ch]; ok {
				delete(set, ch)
				if len(set) == 0 {
					delete(d.waiters, claim)
				}
			}
		}
		d.mu.Unlock()
	}
}

// onCommit wakes the waiters of the claims the events are about and ends
// the connections of relays the log closed (a release, a reap, a
// hibernate, a VMM exit, a shutdown).
func (d *dataPlane) onCommit(evs []event.Event) {
	var stop []*liveRelay
	var reasons []string
	d.mu.Lock()
	for i := range evs {
		ev := &evs[i]
		if ev.AggKind != event.AggClaim {
			continue
		}
		if set := d.waiters[ev.AggID]; set != nil {
			for ch := range set {
				close(ch)
			}
			delete(d.waiters, ev.AggID)
		}
		if ev.Type != event.TypeRelayClosed || len(d.live) == 0 {
			continue
		}
		p, err := ev.Decode()
		if rc, ok := p.(event.RelayClosed); err == nil && ok {
			if l := d.live[rc.Relay]; l != nil {
				stop, reasons = append(stop, l), append(reasons, rc.Reason)
			}
		}
	}
	d.mu.Unlock()
	for i, l := range stop {
		l.end(reasons[i])
	}
}

// shutdown ends every relay with reason and refuses new ones; unless
// abort, it waits (bounded) for them to record their ends and then records
// the rest closed. abort is a crash's: nothing more is recorded (the next
// start closes them in the log).
func (d *dataPlane) shutdown(ctx context.Context, reason string, abort bool) {
	d.mu.Lock()
	d.closing = true
	d.aborted = d.aborted || abort
	live := make([]*liveRelay, 0, len(d.live))
	for _, l := range d.live {
		live = append(live, l)
	}
	for claim, set := range d.waiters {
		for ch := range set {
			close(ch)
		}
		delete(d.waiters, claim)
	}
	d.mu.Unlock()
	for _, l := range live {
		l.end(reason)
	}
	if abort {
		return
	}
	// The relays record their own ends (with their byte counts) as they
	// wind down; those still running when the bound passes are recorded
	// closed in one batch.
	deadline := time.Now().Add(shutdownWait)
	done := make(chan struct{})
	go func() {
		d.mu.Lock()
		for len(d.live) > 0 && ctx.Err() == nil && time.Now().Before(deadline) {
			d.idle.Wait()
		}
		d.mu.Unlock()
		close(done)
	}()
	bound := time.NewTimer(shutdownWait)
	defer bound.Stop()
	select {
	case <-done:
	case <-bound.C:
	case <-ctx.Done():
	}
	d.mu.Lock()
	d.idle.Broadcast() // the waiter above rechecks its bound and leaves
	d.mu.Unlock()
	var open int
	d.s.eng.View(func(st *fsm.State) { open = st.OpenRelays() })
	if open == 0 {
		return
	}
	if _, err := d.s.eng.ProposeNew(ctx, func(m fsm.Meta) fsm.Command {
		return fsm.CloseAllRelays{Meta: m, Reason: reason}
	}, engine.Hooks{}); err != nil {
		d.s.zl.Warn().Err(err).Msg("api: could not record the relays closed; the next start does")
	}
}

// CloseRelays ends every relay (sandboxd is stopping: reason "shutdown")
// and records them closed; relays opened later are refused with 503.
// http.Server.Shutdown does not track the hijacked connections relays run
// on (and would wait for a buffered exec), so the node calls this before
// it.
func (s *Server) CloseRelays(ctx context.Context) { s.data.shutdown(ctx, "shutdown", false) }

// AbortRelays ends every relay as a crash would: nothing is recorded (the
// next start records them closed, reason "restart").
func (s *Server) AbortRelays() { s.data.shutdown(context.Background(), "", true) }

// newRelayID mints "rl_" + 16 hex digits.
func newRelayID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return "rl_" + hex.EncodeToString(b[:])
}

// unknownSandbox is the old daemon's answer for an unknown id and for a
// wrong token alike: the two are indistinguishable by design.
func unknownSandbox() error { return errorf(http.StatusNotFound, "unknown sandbox") }

// requireBearer is the data plane's first check: no bearer token is 401.
func requireBearer(r *http.Request) error {
	if auth.Bearer(r) == "" {
		return errorf(http.StatusUnauthorized, "missing bearer token")
	}
	return nil
}

// sandboxCaller authenticates a data-plane request the old daemon's way: a
// token that is not this sandbox's (another sandbox's, a tenant's, root's
// where root is not accepted, a token of the sandbox's released claim) is
// 404, like an unknown id. root reports a root token, when rootOK.
func (s *Server) sandboxCaller(r *http.Request, rootOK bool) (root bool, err error) {
	switch who := s.auth.Identify(auth.Bearer(r), r.PathValue("id"), s.tokenGen); {
	case who.Kind == auth.Sandbox:
		return false, nil
	case who.Kind == auth.Root && rootOK:
		return true, nil
	}
	return false, unknownSandbox()
}

// guestReady returns claim's VM once the claim runs: a hibernated sandbox
// is woken (the wake goes on if the client leaves) and waited for, within
// Config.ClaimWait. passive (an operator's relay) never wakes: a sandbox
// that is not running is 409.
func (d *dataPlane) guestReady(ctx context.Context, claim string, passive bool) (guestVM, error) {
	bound := time.NewTimer(d.s.cfg.ClaimWait)
	defer bound.Stop()
	woke := false
	for {
		ch, unwatch := d.watch(claim)
		var c fsm.ClaimRec
		var v fsm.VMRec
		var ok, vmOK bool
		d.s.eng.View(func(st *fsm.State) {
			if c, ok = st.Claim(claim); ok {
				v, vmOK = st.VM(c.VM)
			}
		})
		switch {
		case !ok || !c.Status.Live():
			unwatch()
			return guestVM{}, unknownSandbox()
		case c.Status == fsm.ClaimRunning && vmOK && v.Status == fsm.VMClaimed:
			unwatch()
			return guestVM{ID: v.ID, RunDir: v.RunDir}, nil
		case passive:
			unwatch()
			return guestVM{}, errorf(http.StatusConflict, "sandbox %s is %s: a passive relay does not wake it", claim, c.Status)
		case c.Status == fsm.ClaimHibernated && woke:
			unwatch()
			return guestVM{}, errorf(http.StatusBadGateway, "%s: sandbox %s could not be woken", errGuestUnreachable, claim)
		case c.Status == fsm.ClaimHibernated:
			woke = true
			_, err := d.s.eng.ProposeNew(context.WithoutCancel(ctx), func(m fsm.Meta) fsm.Command {
				return fsm.Wake{Meta: m, Claim: claim}
			}, engine.Hooks{})
			if rej, isRej := fsm.AsRejection(err); err != nil && !(isRej && rej.Code == fsm.InvalidTransition) {
				unwatch()
				return guestVM{}, err
			}
		}
		select {
		case <-ch:
			unwatch()
		case <-bound.C:
			unwatch()
			return guestVM{}, errorf(http.StatusServiceUnavailable, "sandbox %s is not running after %s", claim, d.s.cfg.ClaimWait)
		case <-ctx.Done():
			unwatch()
			return guestVM{}, ctx.Err()
		}
	}
}

// dialGuest reaches vm's agent within DataPlane.DialTimeout.
func (d *dataPlane) dialGuest(ctx context.Context, vm guestVM) (net.Conn, error) {
	if d.opts.Dialer == nil {
		return nil, errNoTransport
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.DialTimeout)
	defer cancel()
	return d.opts.Dialer.DialAgent(ctx, vm.RunDir)
}

// opened is a relay recorded open: the guest connection and the live
// registration.
type opened struct {
	id    string
	vm    guestVM
	guest net.Conn
	live  *liveRelay
}

// open readies the guest (waking it unless passive), dials it with dial,
// and records the relay open. A sandbox that leaves running between the
// wake and the record (a hibernate in between) is readied again, within
// the same bound.
func (d *dataPlane) open(ctx context.Context, claim, kind string, port int, passive bool, dial func(context.Context, guestVM) (net.Conn, error)) (*opened, error) {
	for attempt := 0; ; attempt++ {
		vm, err := d.guestReady(ctx, claim, passive)
		if err != nil {
			return nil, err
		}
		guest, err := dial(ctx, vm)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &guestError{err: err}
		}
		id := newRelayID()
		l, err := d.track(id, claim)
		if err != nil {
			guest.Close()
			return nil, err
		}
		_, err = d.s.eng.ProposeNew(ctx, func(m fsm.Meta) fsm.Command {
			return fsm.OpenRelay{Meta: m, ID: id, Claim: claim, Kind: kind, Port: port, Passive: passive}
		}, engine.Hooks{})
		if err == nil {
			return &opened{id: id, vm: vm, guest: guest, live: l}, nil
		}
		d.unregister(id)
		guest.Close()
		if rej, ok := fsm.AsRejection(err); !ok || rej.Code != fsm.InvalidTransition || attempt >= 3 {
			return nil, err
		}
	}
}

// guestError is a failure to reach the guest: 502 with the route's message.
type guestError struct{ err error }

func (e *guestError) Error() string { return e.err.Error() }
func (e *guestError) Unwrap() error { return e.err }

// close records relay o closed with what it carried; a relay the log
// already closed (a release) is a no-op there. A crashed node records
// nothing.
func (d *dataPlane) close(o *opened, res relay.Result) {
	if d.unregister(o.id) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reason := res.Reason
	if reason == "" {
		reason = relay.ReasonClient
	}
	_, err := d.s.eng.ProposeNew(ctx, func(m fsm.Meta) fsm.Command {
		return fsm.CloseRelay{Meta: m, ID: o.id, Reason: reason, BytesIn: res.In, BytesOut: res.Out}
	}, engine.Hooks{})
	if err != nil && !errors.Is(err, engine.ErrStopped) {
		d.s.zl.Warn().Err(err).Str("relay", o.id).Msg("api: relay end not recorded; the next start records it closed")
	}
}

// relayOptions are the splice's options for this node.
func (d *dataPlane) relayOptions() relay.Options {
	return relay.Options{Idle: d.opts.RelayIdle}
}
