package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Hibernate and wake answer as the old daemon's did: once the operation
// has finished (hibernate: the snapshot durable and the VMM stopped, the
// claim hibernated; wake: restored and ready, the claim running) or failed,
// with the failure's reason. The waiting is this projection's alone: the
// request proposes the same command as before and then watches the commits
// of its sandbox (OnCommit), so durability, events and crash safety are the
// state machine's and the executors', as for a client that does not wait.
//
// The calls of one sandbox queue in arrival order (verbQueue): a wake that
// arrives during a hibernate waits for it and then wakes, two hibernates
// both answer once hibernated. The wait is bounded by Config.LifecycleWait:
// past it the answer is 503 with the id, and an operation already started
// continues. "Prefer: respond-async" or "?wait=false" ask for the answer
// when the request is durable instead (202 {"id", "state"}), without
// queueing.

// transitionOp is hibernate or wake, for the waiting handler.
type transitionOp struct {
	verb string
	// from is the status the command starts from, during the status while
	// it runs, to the status it ends in.
	from, during, to fsm.ClaimStatus
	// done and failed are the events that end it.
	done, failed event.Type
	command      func(m fsm.Meta, claim string) fsm.Command
}

var (
	hibernateOp = transitionOp{
		verb: "hibernate", from: fsm.ClaimRunning, during: fsm.ClaimHibernating, to: fsm.ClaimHibernated,
		done: event.TypeHibernated, failed: event.TypeHibernateFailed,
		command: func(m fsm.Meta, c string) fsm.Command { return fsm.Hibernate{Meta: m, Claim: c} },
	}
	wakeOp = transitionOp{
		verb: "wake", from: fsm.ClaimHibernated, during: fsm.ClaimWaking, to: fsm.ClaimRunning,
		done: event.TypeWoken, failed: event.TypeWakeFailed,
		command: func(m fsm.Meta, c string) fsm.Command { return fsm.Wake{Meta: m, Claim: c} },
	}
)

// statusEvents are the events about a claim that change its status: a
// waiting hibernate or wake watches all of them.
var statusEvents = []event.Type{
	event.TypeClaimServed, event.TypeClaimFailed, event.TypeClaimReleased, event.TypeClaimExpired,
	event.TypeHibernateRequested, event.TypeHibernated, event.TypeHibernateFailed,
	event.TypeWakeRequested, event.TypeWoken, event.TypeWakeFailed,
}

func (s *Server) handleHibernate(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	return s.transition(w, r, id, &hibernateOp)
}

func (s *Server) handleWake(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	return s.transition(w, r, id, &wakeOp)
}

// transition answers hibernate or wake: 204 once the sandbox reached
// op.to, or the error that ended the wait.
func (s *Server) transition(w http.ResponseWriter, r *http.Request, id auth.Identity, op *transitionOp) error {
	if err := decodeBody(r, &struct{}{}, true); err != nil {
		return err
	}
	async, err := respondAsync(r)
	if err != nil {
		return err
	}
	c, err := s.liveTarget(r, id)
	if err != nil {
		return err
	}
	if async {
		return s.transitionAsync(w, r, c.ID, op)
	}
	ctx, cancel := s.waitContext(r.Context(), s.cfg.LifecycleWait)
	defer cancel()
	if err := s.queue.enter(ctx, c.ID); err != nil {
		return s.waitErr(r, c.ID, op, "queued behind earlier hibernate and wake calls of this sandbox", err)
	}
	// The answer leaves before the next call of the queue starts, so the
	// calls of one sandbox are answered in the order they run. Deferred, so
	// that a panic (net/http recovers it) leaves the queue too, unanswered.
	rc := http.NewResponseController(w)
	answered := false
	defer func() {
		if answered {
			_ = rc.Flush()
			_ = rc.SetWriteDeadline(time.Time{})
		}
		s.queue.leave(c.ID)
	}()
	err = s.runTransition(ctx, r, c.ID, op)
	// A caller that does not read its answers (pipelined requests filling
	// the socket buffers) must not hold the sandbox's queue: the write is
	// bounded. A socket deadline: the real clock.
	_ = rc.SetWriteDeadline(time.Now().Add(queuedAnswerWait))
	answered = true
	if err != nil {
		s.writeErr(w, r, err)
	} else {
		w.WriteHeader(http.StatusNoContent)
	}
	return nil
}

// queuedAnswerWait bounds writing a hibernate or wake's answer while the
// call holds its sandbox's queue: far beyond what a reading client needs
// for a few hundred bytes.
const queuedAnswerWait = 5 * time.Second

// runTransition brings sandbox id to op.to and returns nil once it is
// there: it proposes op's command when the sandbox is in op.from, waits
// for the outcome while it is in op.during (whoever started it: an idle
// hibernate is waited for like one's own), and waits for any other
// transition in flight (or a claim still pending) to settle first.
func (s *Server) runTransition(ctx context.Context, r *http.Request, id string, op *transitionOp) error {
	wt := s.watch(id, statusEvents...)
	defer s.unwatch(wt)
	for {
		c, found, seq, err := s.durableState(ctx, id)
		switch {
		case err != nil:
			return s.waitErr(r, id, op, "reading its state", err)
		case !found:
			return errorf(http.StatusNotFound, "%s", errUnknownSandbox)
		case !c.Status.Live():
			return endedError(&c)
		case c.Status == op.to:
			return nil
		case c.Status == op.during:
			return s.outcome(ctx, r, wt, seq, id, op)
		case c.Status == op.from:
			res, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return op.command(m, id) }, engine.Hooks{})
			if err != nil {
				return s.settledLive(err, id)
			}
			if len(res.Events) > 0 {
				// Ours started: every event after it is its outcome's.
				return s.outcome(ctx, r, wt, res.Seq, id, op)
			}
			// Something else moved the sandbox first: look again.
		default:
			if _, err := s.next(ctx, wt, seq, statusEvents...); err != nil {
				return s.waitErr(r, id, op, "waiting for it to stop being "+c.Status.String(), err)
			}
		}
	}
}

// outcome waits for the end of the op in flight after seq: nil once done,
// the old daemon's 500 "<verb> failed" with the reason when it failed, its
// 404 when the claim ended first (released during a hibernate, say).
func (s *Server) outcome(ctx context.Context, r *http.Request, wt *watch, seq uint64, id string, op *transitionOp) error {
	ev, err := s.next(ctx, wt, seq, op.done, op.failed, event.TypeClaimFailed, event.TypeClaimReleased, event.TypeClaimExpired)
	if err == nil {
		// The answer reports ev: it goes out once the log is durable up to
		// it (OnCommit saw it durable here; with synchronous replication
		// the Log waits for JetStream too).
		err = s.durableAt(ctx, ev.Seq)
	}
	switch {
	case err != nil:
		return s.waitErr(r, id, op, "", err)
	case ev.Type == op.done:
		return nil
	case ev.Type == op.failed:
		reason := failureReason(ev, op)
		s.zl.Warn().Str("sandbox", id).Str("reason", reason).Msgf("api: %s failed", op.verb)
		return &httpError{status: http.StatusInternalServerError, id: id, msg: op.verb + " failed: " + reason}
	}
	return s.goneOrUnknown(id)
}

// failureReason is what a HibernateFailed or WakeFailed says, and what
// became of the sandbox.
func failureReason(ev event.Event, op *transitionOp) string {
	p, err := ev.Decode()
	if err != nil {
		return fmt.Sprintf("undecodable %s event: %v", ev.Type, err)
	}
	var msg string
	var lost bool
	switch p := p.(type) {
	case event.HibernateFailed:
		msg, lost = p.Error, p.Lost
	case event.WakeFailed:
		msg, lost = p.Error, p.Lost
	}
	switch {
	case lost && op == &hibernateOp:
		return msg + " (its VM is lost: the sandbox failed)"
	case lost:
		return msg + " (its snapshot is lost: the sandbox failed)"
	case op == &hibernateOp:
		return msg + " (the sandbox runs on)"
	}
	return msg + " (the sandbox stays hibernated; a retry restores it)"
}

// waitErr is the answer to a wait that ended with err while doing what:
// past Config.LifecycleWait a 503 naming the sandbox that says what goes
// on; a client that went away or a failing op log is answered as such.
func (s *Server) waitErr(r *http.Request, id string, op *transitionOp, doing string, err error) error {
	if r.Context().Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	status := "unknown"
	if c, ok := s.claim(id); ok {
		status = c.Status.String()
	}
	msg := fmt.Sprintf("sandbox %s: %s not started within %s (%s; it is %s)", id, op.verb, s.cfg.LifecycleWait, doing, status)
	if doing == "" {
		msg = fmt.Sprintf("sandbox %s: %s not finished within %s (it is %s); it continues: the sandbox becomes %s when it is done",
			id, op.verb, s.cfg.LifecycleWait, status, op.to)
	}
	return &httpError{status: http.StatusServiceUnavailable, id: id, msg: msg}
}

// durableState reads claim id with durableRead, and that state's
// sequence: the events after it are the ones the read did not see.
func (s *Server) durableState(ctx context.Context, id string) (c fsm.ClaimRec, found bool, seq uint64, err error) {
	seq, err = s.durableRead(ctx, func(st *fsm.State) { c, found = st.Claim(id) })
	return c, found, seq, err
}

// transitionAsync is hibernate or wake answered once the request is
// durable, as sbxlog did before it waited: 202 with the sandbox's state
// then. It does not queue; a command the state refuses now (a wake during
// a hibernate) is its 409.
func (s *Server) transitionAsync(w http.ResponseWriter, r *http.Request, id string, op *transitionOp) error {
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return op.command(m, id) }, engine.Hooks{}); err != nil {
		return s.settledLive(err, id)
	}
	c, _, _, err := s.durableState(r.Context(), id)
	if err != nil {
		return err
	}
	if prefersAsync(r) {
		w.Header().Set("Preference-Applied", "respond-async")
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"id": id, "state": c.Status.String()})
	return nil
}

// respondAsync reports whether the request asks for the answer once it is
// durable rather than once done: "?wait=false", or the RFC 7240 preference
// "Prefer: respond-async".
func respondAsync(r *http.Request) (bool, error) {
	if vs, ok := r.URL.Query()["wait"]; ok {
		wait, err := strconv.ParseBool(vs[len(vs)-1])
		if err != nil {
			return false, errorf(http.StatusBadRequest, "wait=%q: want true or false", vs[len(vs)-1])
		}
		if !wait {
			return true, nil
		}
	}
	return prefersAsync(r), nil
}

// prefersAsync reports whether the request's Prefer headers hold
// respond-async.
func prefersAsync(r *http.Request) bool {
	for _, h := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(h, ",") {
			name, _, _ := strings.Cut(pref, ";")
			if strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// verbQueue orders the waiting hibernates and wakes of each sandbox: a
// call starts once the one queued before it on the same sandbox left,
// first come first served (the old daemon's per-sandbox transition lock;
// a sync.Mutex would not keep the order).
type verbQueue struct {
	mu sync.Mutex
	// tails holds, per sandbox, the calls queued: each closes its channel
	// when it leaves, and the next in line waits on it.
	tails map[string][]chan struct{}
}

// enter queues a call on sandbox id and returns once it is its turn, or
// ctx's error; after a nil return the call must leave. A call that gives
// up keeps its place until the one before it left, so no call overtakes
// another.
func (q *verbQueue) enter(ctx context.Context, id string) error {
	mine := make(chan struct{})
	q.mu.Lock()
	if q.tails == nil {
		q.tails = map[string][]chan struct{}{}
	}
	line := q.tails[id]
	var prev chan struct{}
	if len(line) > 0 {
		prev = line[len(line)-1]
	}
	q.tails[id] = append(line, mine)
	q.mu.Unlock()
	if prev == nil {
		return nil
	}
	select {
	case <-prev:
		return nil
	case <-ctx.Done():
		go func() { <-prev; q.leave(id) }()
		return ctx.Err()
	}
}

// leave ends the call at the head of sandbox id's queue.
func (q *verbQueue) leave(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	line := q.tails[id]
	close(line[0])
	if len(line) == 1 {
		delete(q.tails, id)
		return
	}
	q.tails[id] = line[1:]
}
