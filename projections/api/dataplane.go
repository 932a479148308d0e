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
	"github.com/sbxlog/sbxlog/projections/relay"
)

// The data plane: the routes that reach a sandbox's guest (agent, ports,
// exec). Each connection to a guest is a relay, recorded in the op log when
// it opens and when it ends (fsm.OpenRelay, fsm.CloseRelay) and never per
// byte or frame; the state's open relays hold the sandbox's idle clock.
// The first relay to a hibernated sandbox wakes it and waits until it runs,
// as POST .../wake does (the same queue, the same bound:
// Config.LifecycleWait). A decision that takes the sandbox out of
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
	// RelayDrain cuts a relay one side of which half-closed once nothing
	// moved the other way for that long (default relay.DefaultDrain).
	RelayDrain time.Duration
	// DialTimeout bounds reaching the guest agent (default 30 s).
	DialTimeout time.Duration
	// RelayMemory is the node's relay memory budget in bytes (default
	// DefaultRelayMemory): every relay reserves its worst-case buffers
	// from it before it opens (relaymem.go).
	RelayMemory int64
	// Preview configures preview URLs (preview.go); the zero value turns
	// them off.
	Preview PreviewConfig
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
	live    map[string]*liveRelay // relay id -> its connection
	closing bool                  // shut down: no new relays
	aborted bool                  // crashed (Kill): record nothing more
	idle    *sync.Cond            // signalled when live shrinks

	execBytes atomic.Int64 // buffered exec output held node-wide
	mem       *relayBudget // the relays' buffers, reserved node-wide
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
	d := &dataPlane{s: s, opts: o, live: map[string]*liveRelay{}, mem: newRelayBudget(o.RelayMemory, s.metrics)}
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

// errNoTransport: the node's hypervisor driver cannot reach guests.
var errNoTransport = fmt.Errorf("%w: this node's hypervisor driver has no guest transport", executors.ErrAgentUnreachable)

func (d *dataPlane) track(id, claim string) (*liveRelay, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrShuttingDown)
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

// onCommit ends the connections of relays the log closed (a release, a
// reap, a hibernate, a VMM exit, a shutdown).
func (d *dataPlane) onCommit(evs []event.Event) {
	var stop []*liveRelay
	var reasons []string
	d.mu.Lock()
	for i := range evs {
		ev := &evs[i]
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

// guestReady returns claim's VM once the claim runs. A sandbox that is not
// running is brought there as POST .../wake brings it, in the same queue
// of the sandbox's hibernates and wakes and within Config.LifecycleWait: a
// hibernated one is woken (the wake goes on if the client leaves), one
// hibernating or pending is waited for; a failed wake is wake's 500. A VM
// restarting under a running claim is waited for too. passive (an
// operator's relay) never wakes: a sandbox that is not running is 409.
func (d *dataPlane) guestReady(ctx context.Context, r *http.Request, claim string, passive bool) (guestVM, error) {
	ctx, cancel := d.s.waitContext(ctx, d.s.cfg.LifecycleWait)
	defer cancel()
	for {
		// Watched before the state is read, so a restart's end cannot
		// slip past.
		var vmID string
		d.s.eng.View(func(st *fsm.State) {
			if c, ok := st.Claim(claim); ok {
				vmID = c.VM
			}
		})
		wt := d.s.watch(vmID, event.TypeVMRestarted, event.TypeVMRestartFailed)
		c, v, seq := d.state(claim)
		switch {
		case c == nil:
			d.s.unwatch(wt)
			return guestVM{}, errorf(http.StatusNotFound, "%s", errUnknownSandbox)
		case !c.Status.Live():
			d.s.unwatch(wt)
			return guestVM{}, endedError(c)
		case c.Status == fsm.ClaimRunning && v != nil && v.Status == fsm.VMClaimed:
			d.s.unwatch(wt)
			return guestVM{ID: v.ID, RunDir: v.RunDir}, nil
		case passive:
			d.s.unwatch(wt)
			return guestVM{}, errorf(http.StatusConflict, "sandbox %s is %s: a passive relay does not wake it", claim, c.Status)
		case c.Status == fsm.ClaimRunning && v != nil && v.ID == vmID:
			// Its VM restarts (its VMM died): wait for the outcome.
			_, err := d.s.next(ctx, wt, seq, event.TypeVMRestarted, event.TypeVMRestartFailed)
			d.s.unwatch(wt)
			if err != nil {
				return guestVM{}, d.s.waitErr(r, claim, &wakeOp, "waiting for its VM's restart", err)
			}
			continue
		}
		d.s.unwatch(wt)
		if err := d.s.queue.enter(ctx, claim); err != nil {
			return guestVM{}, d.s.waitErr(r, claim, &wakeOp, "queued behind earlier hibernate and wake calls of this sandbox", err)
		}
		if err := d.wake(ctx, r, claim); err != nil {
			return guestVM{}, err
		}
	}
}

// wake wakes claim once guestReady holds its turn in the queue, and
// leaves the queue however it ends (a panic included).
func (d *dataPlane) wake(ctx context.Context, r *http.Request, claim string) error {
	defer d.s.queue.leave(claim)
	return d.s.runTransition(ctx, r, claim, &wakeOp)
}

// state reads claim and its VM, and the sequence the state reflects.
func (d *dataPlane) state(claim string) (*fsm.ClaimRec, *fsm.VMRec, uint64) {
	var c *fsm.ClaimRec
	var v *fsm.VMRec
	var seq uint64
	d.s.eng.View(func(st *fsm.State) {
		seq = st.Applied()
		if cr, ok := st.Claim(claim); ok {
			c = &cr
			if vr, ok := st.VM(cr.VM); ok {
				v = &vr
			}
		}
	})
	return c, v, seq
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

// opened is a relay recorded open: the guest connection, the live
// registration and the relay's share of the memory budget (given back by
// close).
type opened struct {
	id    string
	vm    guestVM
	guest net.Conn
	live  *liveRelay
	mem   *relayLease
}

// open reserves the relay's memory, readies the guest (waking it unless
// passive), dials it with dial, and records the relay open. A sandbox that
// leaves running between the wake and the record (a hibernate in between)
// is readied again, within the same bound. A refusal for memory comes
// first, so it neither wakes nor dials.
func (d *dataPlane) open(r *http.Request, claim, kind string, port int, passive bool, dial func(context.Context, guestVM) (net.Conn, error)) (_ *opened, err error) {
	mem, err := d.mem.reserve(relayMemory(kind))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			mem.release()
		}
	}()
	ctx := r.Context()
	for attempt := 0; ; attempt++ {
		vm, err := d.guestReady(ctx, r, claim, passive)
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
		// Not cancelled with the request: a client that leaves during the
		// fsync must not make a committed open look like a failed one.
		_, err = d.s.eng.ProposeNew(context.WithoutCancel(ctx), func(m fsm.Meta) fsm.Command {
			return fsm.OpenRelay{Meta: m, ID: id, Claim: claim, Kind: kind, Port: port, Passive: passive}
		}, engine.Hooks{})
		o := &opened{id: id, vm: vm, guest: guest, live: l, mem: mem}
		if err == nil {
			return o, nil
		}
		guest.Close()
		rej, isRej := fsm.AsRejection(err)
		if !isRej {
			// It may have committed (sync replication that did not
			// acknowledge, a log that failed after the append): record it
			// closed, a no-op for a relay that never opened.
			d.close(o, relay.Result{Reason: "error"})
			return nil, err
		}
		d.unregister(id)
		if rej.Code != fsm.InvalidTransition || attempt >= 3 {
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
	o.mem.release()
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
	return relay.Options{Idle: d.opts.RelayIdle, Drain: d.opts.RelayDrain}
}
