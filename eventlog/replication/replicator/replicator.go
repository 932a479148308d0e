package replicator

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// Sentinel errors.
var (
	// ErrSecondWriter: the node's subject holds events this log did not
	// write. Returned wrapped in *SecondWriterError.
	ErrSecondWriter = errors.New("replicator: another writer publishes as this node")
	// ErrGap: the stream lacks events the local log no longer holds.
	// Returned wrapped in *GapError.
	ErrGap = errors.New("replicator: gap between the stream and the local log")
	// ErrStopped: Run returned after its context ended.
	ErrStopped = errors.New("replicator: stopped")
	// ErrUnreachable: the client is not connected to any NATS server.
	// Returned wrapped in *UnreachableError; retried.
	ErrUnreachable = errors.New("replicator: NATS unreachable")
)

// UnreachableError is a session that failed while the client had no
// connection: it says so, and why the client cannot connect, instead of
// the publish error that followed from it (with the reconnect buffer off, a
// publish while disconnected fails as "outbound buffer limit exceeded").
type UnreachableError struct {
	// URL is the server list, without credentials.
	URL string
	// Status is the connection's state (RECONNECTING, CLOSED, ...).
	Status string
	// Cause is the client's last connection error, or the session's error
	// when the client has none.
	Cause error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("NATS unreachable at %s (%s): %v", e.URL, strings.ToLower(e.Status), e.Cause)
}

func (e *UnreachableError) Unwrap() []error { return []error{ErrUnreachable, e.Cause} }

// RedactURL is urls (comma-separated) with any password or token in them
// replaced by "redacted", for logs and status pages.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "redacted")
		} else {
			u.User = url.User("redacted")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// SecondWriterError says why the stream's subject is not this log's.
type SecondWriterError struct {
	Node    string
	Subject string
	// StreamSeq is the event sequence of the node's last message in the stream.
	StreamSeq uint64
	// LocalLast is the local log's last sequence when the check ran.
	LocalLast uint64
	Reason    string
}

func (e *SecondWriterError) Error() string {
	return fmt.Sprintf("replication of node %s refused: %s holds event %d but %s (local log ends at %d); another process is publishing as node %s, or this node's log is not the one that was replicated",
		e.Node, e.Subject, e.StreamSeq, e.Reason, e.LocalLast, e.Node)
}

func (e *SecondWriterError) Unwrap() error { return ErrSecondWriter }

// TooLargeError: an event's record exceeds the server's max_payload, so it
// can never be published (and no later event may be published before it).
// Raise max_payload on the NATS servers (natsembed.MaxPayload embedded).
type TooLargeError struct {
	Node       string
	Seq        uint64
	Size       int
	MaxPayload int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("replication of node %s stopped: event %d is %d bytes, above the NATS server's max_payload of %d; raise max_payload (at least %d)",
		e.Node, e.Seq, e.Size, e.MaxPayload, e.Size+4096)
}

// GapError: the stream ends at Replicated but the local log starts at
// LocalFirst > Replicated+1, so events in between can never be published.
type GapError struct {
	Node       string
	Replicated uint64
	LocalFirst uint64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("replication of node %s refused: the stream ends at seq %d but the local log starts at %d (events %d..%d were truncated before they were replicated)",
		e.Node, e.Replicated, e.LocalFirst, e.Replicated+1, e.LocalFirst-1)
}

func (e *GapError) Unwrap() error { return ErrGap }

// Options configure a Replicator.
type Options struct {
	// Log is the node's op log. Required.
	Log *eventlog.Log
	// NodeID must equal Log.NodeID() (default: Log.NodeID()).
	NodeID string
	// URL is the NATS server list (comma-separated). Required.
	URL string
	// NATSOptions are appended to the replicator's own connection options
	// (credentials, TLS). The replicator disables the reconnect buffer: a
	// publish while disconnected must fail, not be replayed later.
	NATSOptions []nats.Option
	// Stream is checked (created if missing) before the first publish; it
	// also names the node's subject (Stream.Subject).
	Stream stream.Config
	// CursorFile keeps what was published (the stream, its creation time,
	// the last acknowledged sequence), so a subject whose messages all left
	// the stream (an age or size limit) is not published again from seq 1
	// (default: the log's directory + ".replicated"). It is rewritten at
	// most every CursorEvery (default 100 ms) while publishing, and when
	// Run returns.
	CursorFile  string
	CursorEvery time.Duration
	// Window bounds the events published together: the publishes in flight
	// with one replica, the size of an atomic batch with several (default
	// 256, at most MaxWindow).
	Window int
	// PublishTimeout bounds the wait for one acknowledgement, and each
	// request of a session's start (default 2 s). A publish that reached a
	// stream leader as it died is never acknowledged: the wait is what the
	// other nodes' views lag by, on top of the stream's election, so it is
	// kept short; a timeout only resynchronises from the stream (nothing
	// is published twice: message ids and the subject's fence).
	PublishTimeout time.Duration
	// MinBackoff and MaxBackoff bound the pause between retries after an
	// error (defaults 50 ms and 2 s).
	MinBackoff, MaxBackoff time.Duration
	Logger                 zerolog.Logger
}

// State is the replicator's condition, for status pages.
type State string

// States.
const (
	StateIdle     State = "idle"     // Run not called yet
	StateSyncing  State = "syncing"  // checking the stream and reading the resume point
	StateRunning  State = "running"  // publishing or waiting for new events
	StateRetrying State = "retrying" // an error occurred; backing off
	StateRefused  State = "refused"  // fatal: second writer, gap or incompatible stream
	StateStopped  State = "stopped"  // Run returned after its context ended
)

// Status is a snapshot of the replicator for /v1/info and sbxctl.
type Status struct {
	Node    string `json:"node"`
	Subject string `json:"subject"`
	State   State  `json:"state"`
	// Replicated is the highest event sequence JetStream acknowledged: in
	// this run once Confirmed, else as the cursor file says an earlier run
	// saw it acknowledged (0 without one). A node started while NATS is
	// unreachable reports what it published before, unconfirmed, not 0.
	Replicated uint64 `json:"replicated"`
	// Confirmed: this run has read its resume point from the stream, so
	// Replicated is what the stream holds now. Until then the stream may
	// have lost a tail the cursor counts (JetStream acknowledges before it
	// fsyncs) or have been deleted; that tail is published again.
	Confirmed bool `json:"confirmed"`
	// StreamSeq is the stream sequence of that message.
	StreamSeq uint64 `json:"stream_seq"`
	// Pending is how many durable local events are not in Replicated.
	Pending uint64 `json:"pending"`
	// LastError is the error of the current outage (or the refusal); it is
	// cleared once replication runs again.
	LastError string `json:"last_error,omitempty"`
	// Warnings are the stream's compatible settings that differ from what
	// sbxlog creates (stream.Warnings).
	Warnings []string `json:"warnings,omitempty"`
}

// MaxWindow is the largest Window: JetStream's default atomic batch limit.
const MaxWindow = 1000

// Replicator publishes one node's log. Create with New, run with Run.
type Replicator struct {
	opts    Options
	node    string
	subject string
	log     zerolog.Logger

	// Owned by Run's goroutine.
	atomic  bool      // windows are atomic batches (the stream has replicas > 1)
	outage  time.Time // start of the current outage (zero: none)
	warned  string    // the stream warnings last logged
	created time.Time // the current session's stream creation time

	acked     atomic.Uint64 // highest acknowledged event seq
	streamSeq atomic.Uint64 // its stream sequence
	confirmed atomic.Bool   // acked was read from the stream in this run
	started   atomic.Bool

	mu       sync.Mutex
	progress chan struct{} // closed and replaced when acked advances or the state ends
	state    State
	lastErr  error
	fatal    error
	warnings []string
	cursor   cursor        // what was published, as the cursor file says
	dirty    chan struct{} // the cursor changed since it was written
}

// cursor is the cursor file's content: the node's last acknowledged event
// in one stream, told apart from a stream recreated under the same name by
// its creation time.
type cursor struct {
	Stream    string    `json:"stream"`
	Created   time.Time `json:"created"`
	Subject   string    `json:"subject"`
	Seq       uint64    `json:"seq"`
	StreamSeq uint64    `json:"stream_seq"`
}

// covers reports whether c is about the stream and subject a session uses.
func (c cursor) covers(name string, created time.Time, subject string) bool {
	return c.Seq > 0 && c.Stream == name && c.Created.Equal(created) && c.Subject == subject
}

// New checks opts. It does not connect: Run does, and keeps retrying.
func New(opts Options) (*Replicator, error) {
	if opts.Log == nil {
		return nil, errors.New("replicator: Options.Log is required")
	}
	if opts.URL == "" {
		return nil, errors.New("replicator: Options.URL is required")
	}
	if opts.NodeID == "" {
		opts.NodeID = opts.Log.NodeID()
	}
	if opts.NodeID != opts.Log.NodeID() {
		return nil, fmt.Errorf("replicator: node id %q differs from the log's node %q", opts.NodeID, opts.Log.NodeID())
	}
	if err := stream.CheckNodeID(opts.NodeID); err != nil {
		return nil, fmt.Errorf("replicator: %w", err)
	}
	if _, err := opts.Stream.StreamConfig(); err != nil {
		return nil, fmt.Errorf("replicator: %w", err)
	}
	if opts.CursorFile == "" {
		opts.CursorFile = opts.Log.Dir() + ".replicated"
	}
	if opts.CursorEvery <= 0 {
		opts.CursorEvery = 100 * time.Millisecond
	}
	if opts.Window <= 0 {
		opts.Window = 256
	}
	if opts.Window > MaxWindow {
		return nil, fmt.Errorf("replicator: window %d above %d (JetStream's atomic batch limit)", opts.Window, MaxWindow)
	}
	if opts.PublishTimeout <= 0 {
		opts.PublishTimeout = DefaultPublishTimeout
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 50 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(2*time.Second, opts.MinBackoff)
	}
	r := &Replicator{
		opts:     opts,
		node:     opts.NodeID,
		subject:  opts.Stream.Subject(opts.NodeID),
		log:      opts.Logger.With().Str("component", "replicator").Str("node", opts.NodeID).Logger(),
		progress: make(chan struct{}),
		state:    StateIdle,
		dirty:    make(chan struct{}, 1),
	}
	if err := r.loadCursor(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Replicator) loadCursor() error {
	b, err := os.ReadFile(r.opts.CursorFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = json.Unmarshal(b, &r.cursor)
	}
	if err != nil {
		// Without it an emptied subject would be published again from 1:
		// refuse to guess.
		return fmt.Errorf("replicator: cursor file %s: %w (remove it to publish the log again from where the stream ends)", r.opts.CursorFile, err)
	}
	return nil
}

// keepCursor writes the cursor file whenever it changed, at most every
// CursorEvery, until done is closed; then once more.
func (r *Replicator) keepCursor(done <-chan struct{}) {
	var written cursor
	failing := false
	write := func() {
		r.mu.Lock()
		c := r.cursor
		r.mu.Unlock()
		if c == written {
			return
		}
		if err := writeCursor(r.opts.CursorFile, c); err != nil {
			if !failing {
				r.log.Warn().Err(err).Msg("cannot write the replication cursor; an emptied subject could be published again")
			}
			failing = true
			return
		}
		if failing {
			r.log.Info().Str("cursor", r.opts.CursorFile).Msg("replication cursor written again")
		}
		written, failing = c, false
	}
	for {
		select {
		case <-done:
			write()
			return
		case <-r.dirty:
		}
		write()
		select {
		case <-done:
			write()
			return
		case <-time.After(r.opts.CursorEvery):
		}
	}
}

// writeCursor replaces path with c: a temp file renamed over it, fsynced
// with its directory, so a crash leaves the old or the new cursor.
func writeCursor(path string, c cursor) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// Replicated is the highest event sequence acknowledged by JetStream in
// this run (0 before the first resume point is read from the stream):
// what WaitReplicated waits for. Status also reports an earlier run's.
func (r *Replicator) Replicated() uint64 { return r.acked.Load() }

// known is the highest sequence known to be acknowledged and its stream
// sequence: this run's once confirmed, before that the cursor's when it is
// about this stream and subject. Called with r.mu held.
func (r *Replicator) known() (seq, streamSeq uint64, confirmed bool) {
	if r.confirmed.Load() {
		return r.acked.Load(), r.streamSeq.Load(), true
	}
	if c := r.cursor; c.Stream == r.opts.Stream.StreamName() && c.Subject == r.subject {
		return c.Seq, c.StreamSeq, false
	}
	return 0, 0, false
}

// Status returns a snapshot.
func (r *Replicator) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{Node: r.node, Subject: r.subject, State: r.state}
	st.Replicated, st.StreamSeq, st.Confirmed = r.known()
	if last := r.opts.Log.LastSeq(); last > st.Replicated {
		st.Pending = last - st.Replicated
	}
	if r.lastErr != nil {
		st.LastError = r.lastErr.Error()
	}
	st.Warnings = append([]string(nil), r.warnings...)
	return st
}

// WaitReplicated returns once JetStream has acknowledged event seq. It fails
// with ctx's error, with the fatal error once the replicator refused, or
// ErrStopped once Run returned after its context ended. Before Run starts it
// waits, so callers need not order their start-up against Run's goroutine.
func (r *Replicator) WaitReplicated(ctx context.Context, seq uint64) error {
	for {
		if r.acked.Load() >= seq {
			return nil
		}
		r.mu.Lock()
		ch, state, fatal := r.progress, r.state, r.fatal
		r.mu.Unlock()
		switch {
		case fatal != nil:
			return fatal
		case state == StateStopped:
			return ErrStopped
		}
		// Re-check after taking the channel: an advance in between closed it.
		if r.acked.Load() >= seq {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (r *Replicator) setState(s State, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s == StateRefused {
		r.fatal = err
	}
	r.state = s
	switch {
	case err != nil:
		r.lastErr = err
	case s == StateRunning:
		// Recovered: an error of an outage that ended is no status.
		r.lastErr = nil
	}
	if s == StateRefused || s == StateStopped {
		close(r.progress)
		r.progress = make(chan struct{})
	}
}

// advance records acknowledged progress, in the cursor too, and wakes
// WaitReplicated callers.
func (r *Replicator) advance(seq, streamSeq uint64) {
	r.streamSeq.Store(streamSeq)
	r.acked.Store(seq)
	r.mu.Lock()
	r.confirmed.Store(true)
	close(r.progress)
	r.progress = make(chan struct{})
	if seq > 0 {
		r.cursor = cursor{Stream: r.opts.Stream.StreamName(), Created: r.created, Subject: r.subject, Seq: seq, StreamSeq: streamSeq}
	}
	r.mu.Unlock()
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// Run connects and replicates until ctx ends (returning nil) or a fatal
// condition (returning it). It may be called once.
func (r *Replicator) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("replicator: Run called twice")
	}
	r.setState(StateSyncing, nil)
	nopts := append([]nats.Option{
		nats.Name("sbxlog-replicator-" + r.node),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(true),
		nats.Timeout(2 * time.Second),
	}, r.opts.NATSOptions...)
	// Last, so callers cannot turn it back on: buffered publishes replayed
	// after a reconnect would race the resume point read from the stream.
	nopts = append(nopts, nats.ReconnectBufSize(-1))
	nc, err := nats.Connect(r.opts.URL, nopts...)
	if err != nil {
		err = fmt.Errorf("replicator: connect %s: %w", RedactURL(r.opts.URL), err)
		r.setState(StateRefused, err)
		return err
	}
	defer nc.Close()
	cursorDone := make(chan struct{})
	cursorStopped := make(chan struct{})
	go func() { defer close(cursorStopped); r.keepCursor(cursorDone) }()
	defer func() { close(cursorDone); <-cursorStopped }()
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(2*r.opts.Window),
		jetstream.WithPublishAsyncTimeout(r.opts.PublishTimeout))
	if err != nil {
		r.setState(StateRefused, err)
		return err
	}

	backoff := r.opts.MinBackoff
	for {
		progressed, err := r.session(ctx, nc, js)
		if ctx.Err() != nil {
			r.setState(StateStopped, nil)
			return nil
		}
		if isFatal(err) {
			r.logKnown(r.log.Error().Err(err)).Msg("replication refused; replicator stopped")
			r.setState(StateRefused, err)
			return err
		}
		if progressed {
			backoff = r.opts.MinBackoff
		}
		if !nc.IsConnected() {
			cause := nc.LastError()
			if cause == nil {
				cause = err
			}
			err = &UnreachableError{URL: RedactURL(r.opts.URL), Status: nc.Status().String(), Cause: cause}
		}
		// Each outage is a warning once, however many retries it takes;
		// the recovery is logged at info (session).
		if r.outage.IsZero() {
			r.outage = time.Now()
			r.logKnown(r.log.Warn().Err(err)).Msg("replication interrupted; retrying")
		} else {
			r.log.Debug().Err(err).Msg("replication retry failed")
		}
		r.setState(StateRetrying, err)
		// Full jitter around the backoff keeps many nodes from retrying in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			r.setState(StateStopped, nil)
			return nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, r.opts.MaxBackoff)
	}
}

// logKnown adds what is known to be replicated to a log line, and whether
// this run confirmed it.
func (r *Replicator) logKnown(ev *zerolog.Event) *zerolog.Event {
	r.mu.Lock()
	seq, _, confirmed := r.known()
	r.mu.Unlock()
	return ev.Uint64("replicated", seq).Bool("confirmed", confirmed)
}

func isFatal(err error) bool {
	var ie *stream.IncompatibleError
	var tl *TooLargeError
	return errors.Is(err, ErrSecondWriter) || errors.Is(err, ErrGap) || errors.As(err, &ie) || errors.As(err, &tl)
}

// session checks the stream, reads the resume point and publishes until an
// error. progressed reports whether any window was acknowledged.
func (r *Replicator) session(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) (progressed bool, err error) {
	r.setState(StateSyncing, nil)
	ectx, cancel := context.WithTimeout(ctx, r.opts.PublishTimeout)
	st, err := stream.Ensure(ectx, js, r.opts.Stream)
	cancel()
	if err != nil {
		return false, err
	}
	// The stream's own replicas decide how windows go out: an operator may
	// run it with more than this node is configured for.
	r.atomic, r.created = st.Have.Replicas > 1, st.Created
	r.mu.Lock()
	r.warnings = st.Warnings
	r.mu.Unlock()
	if w := strings.Join(st.Warnings, "; "); w != r.warned {
		r.warned = w
		for _, msg := range st.Warnings {
			r.log.Warn().Str("stream", st.Have.Name).Msg(msg)
		}
	}
	last, sseq, err := r.resume(ctx, js, st)
	if err != nil {
		return false, err
	}
	r.advance(last, sseq)
	sub, err := r.opts.Log.Subscribe(last + 1)
	if errors.Is(err, eventlog.ErrCompacted) {
		return false, &GapError{Node: r.node, Replicated: last, LocalFirst: r.opts.Log.FirstSeq()}
	}
	if err != nil {
		return false, err
	}
	defer sub.Close()
	r.setState(StateRunning, nil)
	ev := r.log.Info().Uint64("resume_after", last).Uint64("stream_seq", sseq).Str("subject", r.subject)
	if !r.outage.IsZero() {
		ev = ev.Dur("outage", time.Since(r.outage).Round(time.Millisecond))
		r.outage = time.Time{}
		ev.Msg("replication resumed")
	} else {
		ev.Msg("replicating")
	}

	batch := make([]event.Event, 0, r.opts.Window)
	for {
		head, err := sub.Next(ctx)
		if err != nil {
			return progressed, err
		}
		batch = append(batch[:0], head)
		// Take what is already durable, without waiting for more.
		if avail := r.opts.Log.LastSeq() - head.Seq; avail > 0 {
			for n := min(avail, uint64(r.opts.Window-1)); n > 0; n-- {
				ev, err := sub.Next(ctx)
				if err != nil {
					return progressed, err
				}
				batch = append(batch, ev)
			}
		}
		if max := nc.MaxPayload(); max > 0 {
			for i := range batch {
				// A record is at most its variable fields plus 96 bytes,
				// and its headers repeat the node (also as a token in the
				// message id) and the aggregate id; the margin is for the
				// fencing and batch headers.
				ev := &batch[i]
				if len(ev.Payload)+2*len(ev.AggID)+5*len(ev.Node)+96+1024 <= int(max) {
					continue
				}
				if size := len(event.Encode(ev)) + stream.HeaderBytes(ev) + 512; int64(size) > max {
					return progressed, &TooLargeError{Node: r.node, Seq: ev.Seq, Size: size, MaxPayload: max}
				}
			}
		}
		if err := r.publishFenced(ctx, js, nc, batch, &sseq); err != nil {
			return progressed, err
		}
		progressed = true
	}
}

// resume reads the node's last message from the stream and checks that it is
// the local log's event with the same sequence. It returns that sequence and
// its stream sequence. A subject without messages is either new (0, 0) or
// one whose messages all left the stream (an age or size limit, a purge):
// the cursor tells them apart, and the latter resumes after the cursor's
// sequence with stream sequence 0, publishing nothing twice.
func (r *Replicator) resume(ctx context.Context, js jetstream.JetStream, st *stream.Ensured) (last, sseq uint64, err error) {
	gctx, cancel := context.WithTimeout(ctx, r.opts.PublishTimeout)
	defer cancel()
	// From the leader: a replica behind it would name an older resume
	// point, which the fence then refuses (stream.LeaderGet).
	m, err := stream.LeaderGet(gctx, js, st.Have.Name, stream.GetRequest{LastBySubject: r.subject})
	localFirst, localLast := r.opts.Log.FirstSeq(), r.opts.Log.LastSeq()
	refuse := func(seq uint64, reason string, args ...any) error {
		return &SecondWriterError{Node: r.node, Subject: r.subject, StreamSeq: seq, LocalLast: localLast, Reason: fmt.Sprintf(reason, args...)}
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		r.mu.Lock()
		cur := r.cursor
		r.mu.Unlock()
		if cur.covers(st.Have.Name, st.Created, r.subject) {
			switch {
			case cur.Seq > localLast:
				return 0, 0, refuse(cur.Seq, "this log has no such event (the stream no longer holds it; the cursor %s says it was published)", r.opts.CursorFile)
			case localFirst > cur.Seq+1 && localLast >= localFirst:
				return 0, 0, &GapError{Node: r.node, Replicated: cur.Seq, LocalFirst: localFirst}
			}
			r.log.Warn().Uint64("published", cur.Seq).Str("stream", st.Have.Name).
				Msg("the node's subject is empty but its events up to this one were published (they left the stream: an age or size limit, or a purge); resuming after it without publishing them again")
			return cur.Seq, 0, nil
		}
		if cur.Seq > 0 && cur.Stream == st.Have.Name && cur.Subject == r.subject {
			r.log.Warn().Time("was_created", cur.Created).Time("created", st.Created).Str("stream", st.Have.Name).
				Msg("the stream was created again since this node last published: publishing the whole log into it")
		}
		if localFirst > 1 && localLast >= localFirst {
			return 0, 0, &GapError{Node: r.node, Replicated: 0, LocalFirst: localFirst}
		}
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read resume point: %w", err)
	}
	remote, err := event.Decode(m.Data)
	switch {
	case err != nil:
		return 0, 0, refuse(0, "its last message (stream seq %d) is not a valid record: %v", m.Sequence, err)
	case remote.Node != r.node:
		return 0, 0, refuse(remote.Seq, "that event names node %q", remote.Node)
	case m.Header.Get(jetstream.MsgIDHeader) != stream.MsgID(r.node, remote.Seq):
		return 0, 0, refuse(remote.Seq, "its message id is %q", m.Header.Get(jetstream.MsgIDHeader))
	case remote.Seq > localLast:
		return 0, 0, refuse(remote.Seq, "this log has no such event")
	case remote.Seq < localFirst:
		if remote.Seq+1 < localFirst {
			return 0, 0, &GapError{Node: r.node, Replicated: remote.Seq, LocalFirst: localFirst}
		}
		// The local copy was truncated right after replication: nothing to
		// compare with, nothing missing.
		r.log.Warn().Uint64("seq", remote.Seq).Msg("resume point no longer in the local log; not verified")
		return remote.Seq, m.Sequence, nil
	}
	local, err := r.opts.Log.Read(remote.Seq, 1)
	if err != nil {
		return 0, 0, fmt.Errorf("read local event %d: %w", remote.Seq, err)
	}
	if len(local) != 1 {
		return 0, 0, fmt.Errorf("read local event %d: not found", remote.Seq)
	}
	if !bytes.Equal(event.Encode(&local[0]), m.Data) {
		return 0, 0, refuse(remote.Seq, "it differs from the local event (stream: %s op %s; local: %s op %s)",
			remote.Type, remote.OpID, local[0].Type, local[0].OpID)
	}
	return remote.Seq, m.Sequence, nil
}

// publishFenced publishes a window, retrying it at once while a clustered
// stream reports our previous message still in flight on the subject (the
// leader can acknowledge a message before it clears it from its in-flight
// set, and refuses an expected-sequence check on the subject until then).
// Such a refusal stores nothing, so sending the same window again is safe;
// every other failure resynchronises from the stream.
func (r *Replicator) publishFenced(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, evs []event.Event, sseq *uint64) error {
	wait := 200 * time.Microsecond
	for attempt := 0; ; attempt++ {
		err := r.publishWindow(ctx, js, nc, evs, sseq)
		var apiErr *jetstream.APIError
		if err == nil || attempt == 8 || !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant {
			return err
		}
		// The first message may have gone through before a follower was
		// refused: continue after what is acknowledged.
		if done := r.acked.Load(); done >= evs[0].Seq {
			evs = evs[done-evs[0].Seq+1:]
			if len(evs) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// DefaultPublishTimeout is Options.PublishTimeout's default.
const DefaultPublishTimeout = 2 * time.Second

// errUnexpectedAck makes the session resynchronise from the stream.
var errUnexpectedAck = errors.New("unexpected acknowledgement")

// publishWindow publishes evs (contiguous) after our message with stream
// sequence *sseq, so that the subject can only ever hold a gap-free prefix
// of the log: a message is stored only if everything before it is.
//
// The first message always carries Nats-Expected-Last-Subject-Sequence
// (*sseq), which is what refuses a second writer. The rest of the window:
//   - one stream replica (the embedded server, where this node is normally
//     the stream's only publisher): once the first message is acknowledged,
//     the others are pipelined, each with Nats-Expected-Last-Msg-Id naming
//     its predecessor's id, so each is stored only right after it. (Not
//     Nats-Expected-Last-Sequence: another publisher's message could fill
//     the expected stream slot after one of ours was refused.) Another
//     publisher on the same stream only causes spurious refusals, which
//     resynchronise and retry.
//   - several replicas (a shared cluster, where a leader change can drop a
//     prefix of pipelined messages and store the rest): the window is one
//     atomic batch, committed entirely or not at all.
func (r *Replicator) publishWindow(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, evs []event.Event, sseq *uint64) error {
	if len(evs) > 1 && r.atomic {
		return r.publishBatch(ctx, nc, evs, sseq)
	}
	pctx, cancel := context.WithTimeout(ctx, r.opts.PublishTimeout)
	ack, err := js.PublishMsg(pctx, r.message(&evs[0]), jetstream.WithExpectLastSequencePerSubject(*sseq), jetstream.WithRetryAttempts(0))
	cancel()
	if err != nil {
		return fmt.Errorf("publish seq %d: %w", evs[0].Seq, err)
	}
	if err := r.checkAck(ack, evs[0].Seq, *sseq); err != nil {
		return err
	}
	*sseq = ack.Sequence
	r.advance(evs[0].Seq, *sseq)
	if len(evs) == 1 {
		return nil
	}
	futs := make([]jetstream.PubAckFuture, 0, len(evs)-1)
	for i := 1; i < len(evs); i++ {
		// No client-side retries: a retried message could land after its
		// successors; the chain refuses it instead and the session resyncs.
		f, err := js.PublishMsgAsync(r.message(&evs[i]),
			jetstream.WithExpectLastMsgID(stream.MsgID(r.node, evs[i-1].Seq)), jetstream.WithRetryAttempts(0))
		if err != nil {
			return fmt.Errorf("publish seq %d: %w", evs[i].Seq, err)
		}
		futs = append(futs, f)
	}
	acked := 0
	defer func() {
		if acked > 0 {
			r.advance(evs[acked].Seq, *sseq)
		}
	}()
	for i, f := range futs {
		seq := evs[i+1].Seq
		select {
		case ack := <-f.Ok():
			if err := r.checkAck(ack, seq, *sseq); err != nil {
				return err
			}
			*sseq = ack.Sequence
			acked = i + 1
		case err := <-f.Err():
			return fmt.Errorf("publish seq %d: %w", seq, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// batchAck is the server's answer to an atomic batch commit.
type batchAck struct {
	Stream    string              `json:"stream"`
	Sequence  uint64              `json:"seq"`
	BatchID   string              `json:"batch"`
	BatchSize uint64              `json:"count"`
	Error     *jetstream.APIError `json:"error"`
}

// publishBatch publishes evs as one atomic batch (JetStream 2.12+): the
// messages are staged by the stream leader and stored together, contiguous,
// when the last one (the commit) arrives complete; a lost message, a leader
// change or a duplicate fails the whole batch.
func (r *Replicator) publishBatch(ctx context.Context, nc *nats.Conn, evs []event.Event, sseq *uint64) error {
	var id [12]byte
	_, _ = crand.Read(id[:])
	batchID := hex.EncodeToString(id[:])
	for i := range evs {
		m := r.message(&evs[i])
		m.Header.Set(hdrBatchID, batchID)
		m.Header.Set(hdrBatchSeq, strconv.Itoa(i+1))
		if i == 0 {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(*sseq, 10))
		}
		if i < len(evs)-1 {
			if err := nc.PublishMsg(m); err != nil {
				return fmt.Errorf("publish seq %d: %w", evs[i].Seq, err)
			}
			continue
		}
		m.Header.Set(hdrBatchCommit, "1")
		pctx, cancel := context.WithTimeout(ctx, r.opts.PublishTimeout)
		resp, err := nc.RequestMsgWithContext(pctx, m)
		cancel()
		if err != nil {
			return fmt.Errorf("commit batch of seqs %d..%d: %w", evs[0].Seq, evs[i].Seq, err)
		}
		var ack batchAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return fmt.Errorf("commit batch of seqs %d..%d: bad reply %q: %w", evs[0].Seq, evs[i].Seq, resp.Data, err)
		}
		if ack.Error != nil {
			return fmt.Errorf("commit batch of seqs %d..%d: %w", evs[0].Seq, evs[i].Seq, ack.Error)
		}
		if ack.BatchID != batchID || ack.BatchSize != uint64(len(evs)) || ack.Sequence < *sseq+uint64(len(evs)) {
			return fmt.Errorf("%w: batch %s of %d stored as batch %s of %d ending at stream seq %d", errUnexpectedAck, batchID, len(evs), ack.BatchID, ack.BatchSize, ack.Sequence)
		}
		*sseq = ack.Sequence
		r.advance(evs[i].Seq, *sseq)
	}
	return nil
}

// Atomic batch headers (nats-server 2.12+; nats.go has no helper for them).
const (
	hdrBatchID     = "Nats-Batch-Id"
	hdrBatchSeq    = "Nats-Batch-Sequence"
	hdrBatchCommit = "Nats-Batch-Commit"
)

// checkAck accepts a fresh acknowledgement placed after prev. A duplicate or
// an out-of-order position means the subject moved under us: the session
// restarts and the resume check decides whether that was this log.
func (r *Replicator) checkAck(ack *jetstream.PubAck, seq, prev uint64) error {
	switch {
	case ack.Duplicate:
		return fmt.Errorf("%w: seq %d acknowledged as duplicate of stream seq %d", errUnexpectedAck, seq, ack.Sequence)
	case ack.Sequence <= prev:
		return fmt.Errorf("%w: seq %d stored at stream seq %d, not after %d", errUnexpectedAck, seq, ack.Sequence, prev)
	}
	return nil
}

func (r *Replicator) message(ev *event.Event) *nats.Msg { return r.opts.Stream.Message(ev) }
