// Package feed delivers the op logs in the stream to a consumer (follower,
// audit, usage, cluster view) through a durable JetStream consumer, verified:
// every record's checksum, its node against its subject, its message id
// against its sequence, its headers against the record (stream.CheckMessage;
// every message format up to stream.FormatCurrent is read), and each node's
// sequences contiguous.
//
// Three positions say how far a consumer got; the feed keeps them apart:
//   - the output's position, Handler.Position(node): the last event of the
//     node whose effects the output holds. Exact for most handlers; a
//     Lagging handler's (usage) stays at the last event that left a trace,
//     so it may be below the last event applied.
//   - the acknowledged floor: the stream sequence up to which the durable
//     consumer acknowledged. The feed acknowledges a batch only after Apply
//     made it durable, and only after checking it continues each node
//     exactly, so every event of the filter at or below the floor is applied
//     to the output, unless the output is not the one the durable was fed
//     into (a fresh or restored output: see below). It may be behind the
//     output's position: acknowledgements are not waited for, and a crash
//     can fall between Apply and the acknowledgement.
//   - the feed's position of a node: the last event applied, so the next
//     delivery must be exactly the one after it. It starts, the first time
//     a node is seen, at the output's position (for a Lagging handler at
//     least the event at the floor). When a delivery skips sequences past
//     it, a Lagging handler's output cannot say whether the events between
//     were applied, so the floor, read again from the consumer, decides:
//     they were if they lie at or below it, which they must when no
//     message was removed from the stream between the floor and the
//     delivery (the recreated durable delivers every message of its filter
//     after the floor, in order).
//
// Invariant: a delivery that skips sequences past the feed's position is
// taken for a gap only when neither the output's position nor the
// acknowledged floor proves the events between applied: it is then a real
// hole in the stream (messages deleted, or removed by a limit before this
// consumer got them), never a position the feed accepted behind what it
// had acknowledged.
//
// Contract:
//   - The consumer's own durable output is the truth about what it has
//     applied: events at or below the feed's position are skipped. So a
//     crash between a handler's write and the acknowledgement, a
//     redelivery, or a durable consumer that restarted from scratch never
//     applies an event twice.
//   - Apply receives events in stream order (per node in sequence order, each
//     node's next sequence exactly) and must make their effects durable
//     before returning nil; then the batch is acknowledged. A Lagging
//     handler may be given again events after its Position that it was
//     given before: they left no trace, so applying them again must not
//     either.
//   - A durable consumer that is ahead of the output is rebuilt from the
//     start of the stream: when the last message it acknowledged belongs to
//     a node the output holds less of (for a Lagging handler: nothing of),
//     e.g. a fresh output under an old durable name, or an output restored
//     from a backup. So is one whose next delivered event skips sequences
//     of a node (once), with a warning naming the missing events. A gap
//     that remains is fatal: *GapError.
//   - A record that fails verification is fatal: *CorruptError. A handler
//     error is fatal and returned as is. Connection loss, leader elections
//     and deleted consumers are retried with backoff.
package feed

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
)

// Handler is a consumer of the feed.
type Handler interface {
	// Position is the last sequence of node whose effects the handler has
	// made durable (0: none).
	Position(node string) uint64
	// Apply makes the effects of evs durable.
	Apply(ctx context.Context, evs []event.Event) error
}

// Lagging is implemented by handlers whose Position may stay below the last
// event they were given, because some events leave no trace in their
// output (usage writes no record for them). The feed then takes a durable
// consumer that acknowledged more than Position as consistent, unless
// Position is 0 (the output holds nothing of that node), and its
// acknowledged floor as the word on which events were applied beyond
// Position.
type Lagging interface {
	PositionLags() bool
}

// GapError: the stream lacks sequences of a node the handler needs.
type GapError struct {
	Node      string
	Want, Got uint64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("feed: node %s: next event is seq %d but the stream delivered seq %d (events %d..%d are missing from the stream)",
		e.Node, e.Want, e.Got, e.Want, e.Got-1)
}

// CorruptError: a message of the stream is not a valid record of the node
// its subject names.
type CorruptError struct {
	StreamSeq uint64
	Subject   string
	Err       error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("feed: stream seq %d on %s: %v", e.StreamSeq, e.Subject, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Options configure a Feed.
type Options struct {
	// JS is the JetStream context (the caller owns its connection).
	JS jetstream.JetStream
	// Stream (default stream.DefaultName).
	Stream string
	// SubjectPrefix of the node subjects (default stream.DefaultSubjectPrefix).
	SubjectPrefix string
	// Durable is the consumer's name: letters, digits, '-', '_' and '='
	// (stream.CheckDurable). Empty
	// means an ephemeral consumer, for handlers whose state lives in memory
	// (the cluster view): it starts at the beginning of the stream, resumes
	// after the last message it delivered when it has to be recreated, and
	// the server forgets it once the feed stops.
	Durable string
	// Nodes limits the feed to these nodes' subjects; empty means all.
	Nodes []string
	// Batch bounds the events per Apply (default 256).
	Batch int
	// MinBackoff and MaxBackoff bound the pause between retries (defaults
	// 50 ms and 2 s).
	MinBackoff, MaxBackoff time.Duration
	// Heartbeat, when set (at least 500 ms), is the idle heartbeat asked
	// of the server for each pull: two missed ones end the session and the
	// consumer is re-created, so a consumer lost with its server is noticed
	// within 2*Heartbeat (default: the client's, about 30 s to notice).
	Heartbeat time.Duration
	// RetryGaps (an ephemeral consumer only): a gap in a node's events does
	// not end Run; the consumer is created again from the start of the
	// stream (what was applied is skipped) after the usual pause, for as
	// long as the gap lasts, while Status says retrying. For an output that
	// tells its readers it is behind while the feed is not running (the
	// cluster view): through a stream leader's loss, a consumer re-created
	// on another server was seen to deliver a node's next event without
	// the one before it, which the stream did hold.
	RetryGaps bool
	// DirectReads (an ephemeral consumer only): between attempts to
	// create the consumer again, the feed reads what the stream holds
	// after its last message by direct gets, which any of the stream's
	// replicas answers without a consumer, the JetStream meta leader or
	// the stream leader. Creating a consumer waits for the meta leader: a
	// lost server that led the meta group stalls it for that group's
	// election, while the surviving replicas already hold every event
	// published. The stream must allow direct gets (stream.Config does);
	// on one that does not, the reads find no responder and the feed
	// waits for its consumer as before.
	DirectReads bool
	Logger      zerolog.Logger
}

// Feed runs one durable consumer into one Handler.
type Feed struct {
	opts    Options
	h       Handler
	log     zerolog.Logger
	layout  stream.Config // names the subjects
	filters []string

	attachOnce sync.Once
	attached   chan struct{}

	mu      sync.Mutex
	pos     map[string]uint64 // the feed's positions: next expected is pos+1
	lastSeq uint64            // stream sequence of the last message handled
	reset   bool              // the consumer was rebuilt for a gap once
	// floor is the acknowledged floor of a durable kept for this output
	// (0: none); floorAt is the event at it, when it could be read.
	floor   uint64
	floorAt ackedEvent
	status  Status
}

// ackedEvent is the event of the message at the acknowledged floor.
type ackedEvent struct {
	node string
	seq  uint64
}

// Status is a snapshot for status pages.
type Status struct {
	Durable string `json:"durable"`
	State   string `json:"state"` // idle, running, retrying, failed, stopped
	// Since is when the feed entered running, or when it last left it
	// (local time).
	Since     time.Time         `json:"since"`
	Positions map[string]uint64 `json:"positions"`
	LastError string            `json:"last_error,omitempty"`
}

// New checks opts.
func New(opts Options, h Handler) (*Feed, error) {
	if opts.JS == nil || h == nil {
		return nil, errors.New("feed: JetStream context and handler are required")
	}
	if opts.Durable != "" {
		if err := stream.CheckDurable(opts.Durable); err != nil {
			return nil, fmt.Errorf("feed: durable name: %w", err)
		}
	}
	layout := stream.Config{Name: opts.Stream, SubjectPrefix: opts.SubjectPrefix}
	if err := layout.Validate(); err != nil {
		return nil, fmt.Errorf("feed: %w", err)
	}
	opts.Stream = layout.StreamName()
	if opts.Batch <= 0 {
		opts.Batch = 256
	}
	if opts.Heartbeat != 0 && opts.Heartbeat < 500*time.Millisecond {
		return nil, fmt.Errorf("feed: heartbeat %s below 500ms", opts.Heartbeat)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 50 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(2*time.Second, opts.MinBackoff)
	}
	filters := []string{layout.Wildcard()}
	if len(opts.Nodes) > 0 {
		filters = filters[:0]
		for _, n := range opts.Nodes {
			if err := stream.CheckNodeID(n); err != nil {
				return nil, fmt.Errorf("feed: %w", err)
			}
			filters = append(filters, layout.Subject(n))
		}
	}
	return &Feed{
		opts:     opts,
		h:        h,
		log:      opts.Logger.With().Str("component", "feed").Str("durable", cmp.Or(opts.Durable, "(ephemeral)")).Logger(),
		layout:   layout,
		filters:  filters,
		attached: make(chan struct{}),
		pos:      map[string]uint64{},
		status:   Status{Durable: opts.Durable, State: "idle"},
	}, nil
}

// Attached is closed once Run has its consumer in place for the first time
// (created, or checked against the handler's positions and kept or
// rebuilt): from then on the consumer's acknowledged floor speaks for the
// output.
func (f *Feed) Attached() <-chan struct{} { return f.attached }

// Status returns a snapshot.
func (f *Feed) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.status
	st.Positions = make(map[string]uint64, len(f.pos))
	for n, p := range f.pos {
		st.Positions[n] = p
	}
	return st
}

func (f *Feed) setState(state string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Since counts from entering running, or from leaving it: the states
	// on the way back (retrying, attaching, catching_up) keep it.
	if (state == "running") != (f.status.State == "running") || f.status.Since.IsZero() {
		f.status.Since = time.Now()
	}
	f.status.State = state
	if err != nil {
		f.status.LastError = err.Error()
	}
}

// errResetConsumer asks Run to rebuild the durable consumer from the start.
var errResetConsumer = errors.New("feed: rebuild consumer")

// Run consumes until ctx ends (nil) or a fatal error.
func (f *Feed) Run(ctx context.Context) error {
	backoff := f.opts.MinBackoff
	for {
		f.setState("attaching", nil)
		progressed, err := f.session(ctx)
		if ctx.Err() != nil {
			f.setState("stopped", nil)
			return nil
		}
		if errors.Is(err, errResetConsumer) {
			continue
		}
		var ge *GapError
		var ce *CorruptError
		var he handlerError
		retryGap := errors.As(err, &ge) && f.opts.RetryGaps && f.opts.Durable == ""
		switch {
		case retryGap:
			f.log.Warn().Err(err).Msg("feed gap; reading the stream again from its start")
			f.mu.Lock()
			f.lastSeq = 0
			f.mu.Unlock()
		case errors.As(err, &ge), errors.As(err, &ce), errors.As(err, &he):
			return f.stop(err)
		}
		if progressed && !retryGap {
			// (A replay up to a gap that lasts reads the stream again at
			// the longest pause, not in a tight loop.)
			backoff = f.opts.MinBackoff
		}
		if f.opts.DirectReads && f.opts.Durable == "" && !retryGap {
			n, derr := f.readDirect(ctx)
			if n > 0 {
				f.log.Info().Int("events", n).Msg("feed read the stream directly while its consumer is away")
			}
			switch {
			case errors.As(derr, &ce), errors.As(derr, &he):
				// Fatal as from a consumer's delivery. (A gap is left to
				// the consumer, which reads the stream again.)
				return f.stop(derr)
			case derr != nil:
				f.log.Debug().Err(derr).Msg("direct read of the stream")
			}
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			// A node's first start: its replicator creates the stream.
			f.log.Info().Err(err).Msg("feed waiting for the stream to be created")
		} else {
			f.log.Warn().Err(err).Msg("feed interrupted; retrying")
		}
		f.setState("retrying", err)
		select {
		case <-ctx.Done():
			f.setState("stopped", nil)
			return nil
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(2*backoff, f.opts.MaxBackoff)
	}
}

// stop ends Run for a fatal error: a corrupt record, a gap that is not
// retried, a handler's error (returned as is).
func (f *Feed) stop(err error) error {
	var he handlerError
	if errors.As(err, &he) {
		f.log.Error().Err(he.err).Msg("feed handler failed; feed stopped")
		f.setState("failed", he.err)
		return he.err
	}
	f.log.Error().Err(err).Msg("feed stopped")
	f.setState("failed", err)
	return err
}

// readDirect applies what the stream holds after the feed's last message,
// read by direct gets (Options.DirectReads), until it holds no more, a
// read fails, ctx ends, or it has read for as long as an attempt to create
// the consumer may take; it returns how many messages it applied. Each
// get names the next sequence and the filter, so the replica answering
// skips other subjects; a replica a little behind the others answers
// "none" early, and the consumer delivers the rest. (One message per get
// is slow next to a consumer's batches: a long stream, read from its
// start, gives way to the consumer between reads, which go on from where
// they stopped.)
func (f *Feed) readDirect(ctx context.Context) (int, error) {
	budget := time.NewTimer(cmp.Or(f.attemptTimeout(), 2*time.Second))
	defer budget.Stop()
	subj := stream.APISubject(f.opts.JS, "DIRECT.GET."+f.opts.Stream)
	nc := f.opts.JS.Conn()
	// One subject per get: the filter's common wildcard, narrowed below.
	filter := f.layout.Wildcard()
	n := 0
	batch := make([]delivered, 0, f.opts.Batch)
	var evs []event.Event
	f.mu.Lock()
	from := f.lastSeq + 1 // the next get's sequence
	f.mu.Unlock()
	// passed is the last message read of a subject the feed does not
	// follow. It becomes the last message handled only once the batch
	// read before it is applied: the consumer starts after the last
	// message handled, and must not start past an event not applied.
	var passed uint64
	flush := func() error {
		if len(batch) > 0 {
			var err error
			evs, err = f.apply(ctx, batch, evs)
			n += len(batch)
			batch = batch[:0]
			if err != nil {
				return err
			}
		}
		if passed > 0 {
			f.mu.Lock()
			f.lastSeq = max(f.lastSeq, passed)
			f.mu.Unlock()
			passed = 0
		}
		return nil
	}
	for ctx.Err() == nil {
		select {
		case <-budget.C:
			return n, flush()
		default:
		}
		req, _ := json.Marshal(stream.GetRequest{Seq: from, NextBySubject: filter})
		rctx, cancel := context.WithTimeout(ctx, directGetTimeout)
		m, err := nc.RequestWithContext(rctx, subj, req)
		cancel()
		if err != nil {
			return n, errors.Join(flush(), fmt.Errorf("direct get from stream seq %d: %w", from, err))
		}
		d, found, err := directMsg(m, f.opts.Stream)
		if err != nil || !found {
			return n, errors.Join(flush(), err)
		}
		if d.sseq < from {
			return n, errors.Join(flush(), fmt.Errorf("direct get from stream seq %d answered seq %d", from, d.sseq))
		}
		from = d.sseq + 1
		if f.follows(d.subject) {
			batch = append(batch, d)
		} else {
			// Another node's subject this feed does not follow: skipped.
			passed = d.sseq
		}
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	return n, errors.Join(flush(), ctx.Err())
}

// attemptTimeout bounds one attempt to create the ephemeral consumer, and
// so a round of direct reads between attempts: four heartbeats (0: no
// heartbeat asked, the client's own request timeout).
func (f *Feed) attemptTimeout() time.Duration { return 4 * f.opts.Heartbeat }

// follows reports whether subject is one of the feed's: its filter is the
// stream's wildcard, or names the subject's node.
func (f *Feed) follows(subject string) bool {
	return slices.ContainsFunc(f.filters, func(flt string) bool { return flt == f.layout.Wildcard() || flt == subject })
}

// directGetTimeout bounds one direct get: a replica answers at once, and a
// request nobody answers (no responders) fails at once too.
const directGetTimeout = time.Second

// directMsg reads a direct get's answer: a stored message, or none left
// (a 404 status, no payload). An answer from another stream than name is
// an error: a mirror of the stream answers its direct gets too (the server
// has a mirror inherit them), and a mirror that keeps some subjects only
// would pass over the others' messages, which the consumer would then
// start after.
func directMsg(m *nats.Msg, name string) (delivered, bool, error) {
	if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
		if status == "404" {
			return delivered{}, false, nil
		}
		return delivered{}, false, fmt.Errorf("direct get: status %s %s", status, m.Header.Get("Description"))
	}
	if from := m.Header.Get(jetstream.StreamHeader); from != name {
		return delivered{}, false, fmt.Errorf("direct get answered by stream %q (a mirror), not %s", from, name)
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return delivered{}, false, fmt.Errorf("direct get: sequence header %q", m.Header.Get(jetstream.SequenceHeader))
	}
	subject := m.Header.Get(jetstream.SubjectHeader)
	if subject == "" {
		return delivered{}, false, errors.New("direct get: no subject header")
	}
	return delivered{subject: subject, sseq: seq, pending: -1, header: m.Header, data: m.Data}, true, nil
}

type handlerError struct{ err error }

func (e handlerError) Error() string { return e.err.Error() }

func (f *Feed) consumerConfig() jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
		Durable:       f.opts.Durable,
		Description:   "sbxlog feed",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       time.Minute,
		MaxAckPending: 4 * f.opts.Batch,
	}
	if f.opts.Durable == "" {
		cfg.AckPolicy, cfg.MaxAckPending = jetstream.AckNonePolicy, 0
		cfg.InactiveThreshold = time.Minute
		f.mu.Lock()
		if f.lastSeq > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, f.lastSeq+1
		}
		f.mu.Unlock()
	}
	if len(f.filters) == 1 {
		cfg.FilterSubject = f.filters[0]
	} else {
		cfg.FilterSubjects = f.filters
	}
	return cfg
}

func (f *Feed) session(ctx context.Context) (progressed bool, err error) {
	cons, err := f.consumer(ctx)
	if err != nil {
		return false, fmt.Errorf("consumer %s: %w", cmp.Or(f.opts.Durable, "(ephemeral)"), err)
	}
	f.attachOnce.Do(func() { close(f.attached) })
	mopts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(2 * f.opts.Batch)}
	if hb := f.opts.Heartbeat; hb > 0 {
		mopts = append(mopts, jetstream.PullHeartbeat(hb), jetstream.PullExpiry(max(10*hb, 5*time.Second)),
			jetstream.WithMessagesErrOnMissingHeartbeat(true))
	}
	it, err := cons.Messages(mopts...)
	if err != nil {
		return false, fmt.Errorf("consumer %s: %w", f.opts.Durable, err)
	}
	// Running once the consumer has delivered what the stream held when it
	// was made (catching up until then: a reader of the output must not
	// take "not there" for an answer yet).
	if info := cons.CachedInfo(); info != nil && info.NumPending > 0 {
		f.setState("catching_up", nil)
	} else {
		f.setState("running", nil)
	}
	defer it.Stop()
	msgs := make([]jetstream.Msg, 0, f.opts.Batch)
	batch := make([]delivered, 0, f.opts.Batch)
	evs := make([]event.Event, 0, f.opts.Batch)
	for {
		first, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return progressed, err
		}
		msgs = append(msgs[:0], first)
		for len(msgs) < f.opts.Batch {
			// Take what has already arrived; a short wait lets a burst
			// share one Apply without delaying a lone event noticeably.
			m, err := it.Next(jetstream.NextMaxWait(200 * time.Microsecond))
			if err != nil {
				break
			}
			msgs = append(msgs, m)
		}
		batch = batch[:0]
		for _, m := range msgs {
			d := delivered{subject: m.Subject(), header: m.Headers(), data: m.Data(), pending: -1}
			if md, err := m.Metadata(); err == nil {
				d.sseq, d.pending = md.Sequence.Stream, int64(md.NumPending)
			}
			batch = append(batch, d)
		}
		if evs, err = f.apply(ctx, batch, evs); err != nil {
			return progressed, err
		}
		// AckAll: acknowledging the last message covers the batch.
		if f.opts.Durable != "" {
			if err := msgs[len(msgs)-1].Ack(); err != nil {
				return true, fmt.Errorf("ack: %w", err)
			}
		}
		progressed = true
	}
}

// delivered is one message of the stream as the feed checks it, from a
// consumer's delivery or a direct get.
type delivered struct {
	subject string
	sseq    uint64 // stream sequence (0: unknown)
	pending int64  // messages of the filter after it (-1: unknown)
	header  nats.Header
	data    []byte
}

// apply verifies batch, hands its new events to the handler and advances
// the feed's positions and last stream sequence. It returns evs for reuse.
func (f *Feed) apply(ctx context.Context, batch []delivered, evs []event.Event) ([]event.Event, error) {
	evs, err := f.verify(ctx, batch, evs[:0])
	if err != nil {
		return evs, err
	}
	if len(evs) > 0 {
		if err := f.h.Apply(ctx, evs); err != nil {
			if ctx.Err() != nil {
				// Stopped in the middle of Apply: the batch may be
				// durable all the same, and the handler's position
				// says how far, for Status.
				f.mu.Lock()
				for i := range evs {
					f.pos[evs[i].Node] = f.h.Position(evs[i].Node)
				}
				f.mu.Unlock()
				return evs, ctx.Err()
			}
			return evs, handlerError{err}
		}
		f.mu.Lock()
		for i := range evs {
			f.pos[evs[i].Node] = evs[i].Seq
		}
		f.mu.Unlock()
	}
	if last := batch[len(batch)-1]; last.sseq > 0 {
		f.mu.Lock()
		f.lastSeq = max(f.lastSeq, last.sseq)
		if last.pending == 0 && f.status.State == "catching_up" {
			f.status.State, f.status.Since = "running", time.Now()
		}
		f.mu.Unlock()
	}
	return evs, nil
}

// consumer returns the feed's consumer, creating it when missing.
//
// An existing durable is not reused as it is: it is recreated to start
// right after its acknowledged floor, so this run is delivered every
// message of its filter after the floor, in order. A reused durable may
// hold messages delivered to an earlier run and never acknowledged (a
// crash, a stop with messages prefetched, or a pull request of a stopped
// run that outlives it and takes messages published after the stop): the
// server would send those again only after AckWait, and this run would
// first see the messages after them. What was applied but not
// acknowledged is skipped by the feed's positions. A durable that is ahead
// of the output is rebuilt from the start of the stream instead
// (aheadOfOutput).
func (f *Feed) consumer(ctx context.Context) (jetstream.Consumer, error) {
	cfg := f.consumerConfig()
	if f.opts.Durable == "" {
		if t := f.attemptTimeout(); t > 0 {
			// A feed that must notice losses fast does not wait out the
			// client's request timeout on a server that just died (a
			// meta or stream leader election): it tries again.
			cctx, cancel := context.WithTimeout(ctx, t)
			defer cancel()
			ctx = cctx
		}
		return f.opts.JS.CreateConsumer(ctx, f.opts.Stream, cfg)
	}
	cons, err := f.opts.JS.Consumer(ctx, f.opts.Stream, f.opts.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return f.opts.JS.CreateConsumer(ctx, f.opts.Stream, cfg)
	}
	if err != nil {
		return nil, err
	}
	info := cons.CachedInfo()
	at, ahead, err := f.aheadOfOutput(ctx, info)
	if err != nil {
		return nil, err
	}
	switch {
	case ahead != "":
		f.log.Info().Uint64("acknowledged_stream_seq", info.AckFloor.Stream).
			Msgf("the durable consumer is ahead of the output (%s): rebuilding it from the start of the stream", ahead)
	case info.AckFloor.Stream > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, info.AckFloor.Stream+1
		if slices.Equal(filtersOf(info.Config), f.filters) {
			// The output applied everything the durable acknowledged:
			// the floor speaks for it (firstPosition, acknowledged). Not for another
			// filter: it says nothing of the subjects it did not cover.
			f.mu.Lock()
			if info.AckFloor.Stream > f.floor {
				f.floor, f.floorAt = info.AckFloor.Stream, at
			}
			f.mu.Unlock()
		}
		f.log.Debug().Int("unacknowledged", info.NumAckPending).Uint64("from_stream_seq", cfg.OptStartSeq).Msg("restarting the durable consumer after its acknowledged floor")
	}
	if err := f.opts.JS.DeleteConsumer(ctx, f.opts.Stream, f.opts.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	return f.opts.JS.CreateConsumer(ctx, f.opts.Stream, cfg)
}

// aheadOfOutput says why the durable consumer acknowledged more than the
// handler's output holds ("" when it did not): the last message it
// acknowledged is an event of a node the handler's Position is below (for
// a Lagging handler: at 0). Without this, a fresh output under an existing
// durable name would receive nothing: the server has delivered everything
// to the durable already. It returns the event at the floor when the
// stream still holds it.
func (f *Feed) aheadOfOutput(ctx context.Context, info *jetstream.ConsumerInfo) (ackedEvent, string, error) {
	at, err := f.eventAt(ctx, info.AckFloor.Stream)
	if err != nil || at.node == "" {
		// Gone from the stream: the gap check is what is left.
		return at, "", err
	}
	pos := f.h.Position(at.node)
	if pos >= at.seq || (f.lagging() && pos > 0) {
		return at, "", nil
	}
	return at, fmt.Sprintf("it acknowledged event %d of node %s, the output holds up to %d", at.seq, at.node, pos), nil
}

// eventAt reads which node's event the message at stream sequence sseq
// is; zero when there is none (0, or it left the stream) or it is not a
// node's event.
func (f *Feed) eventAt(ctx context.Context, sseq uint64) (ackedEvent, error) {
	if sseq == 0 {
		return ackedEvent{}, nil
	}
	m, err := stream.LeaderGet(ctx, f.opts.JS, f.opts.Stream, stream.GetRequest{Seq: sseq})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ackedEvent{}, nil
	}
	if err != nil {
		return ackedEvent{}, fmt.Errorf("read the last acknowledged message (stream seq %d): %w", sseq, err)
	}
	node, ok := f.layout.NodeOf(m.Subject)
	if !ok {
		return ackedEvent{}, nil
	}
	seq, ok := stream.SeqOfMsgID(node, m.Header.Get(jetstream.MsgIDHeader))
	if !ok {
		return ackedEvent{}, nil
	}
	return ackedEvent{node: node, seq: seq}, nil
}

func (f *Feed) lagging() bool {
	l, ok := f.h.(Lagging)
	return ok && l.PositionLags()
}

// firstPosition is the feed's position of node when its first message
// arrives: the output's position, for a Lagging handler raised to the
// event at the acknowledged floor. Called with f.mu held.
func (f *Feed) firstPosition(node string) uint64 {
	p := f.h.Position(node)
	if f.lagging() && f.floorAt.node == node {
		p = max(p, f.floorAt.seq)
	}
	return p
}

// acknowledged reports whether the acknowledged floor proves that the
// events of node before seq (at stream sequence sseq) were applied, when
// the next delivery skips sequences a Lagging handler's output cannot vouch
// for. The floor is read again from the consumer: a stopped run's last
// acknowledgement can reach the recreated durable late, and the server
// then skips what it covers. The node's events before seq sit at stream
// sequences below sseq; those at or below the floor were applied, and
// those above it were delivered to this run before seq unless the stream
// lost them (removedSince). Called with f.mu held.
func (f *Feed) acknowledged(ctx context.Context, node string, seq, sseq uint64) (bool, error) {
	if !f.lagging() || f.opts.Durable == "" {
		return false, nil
	}
	cons, err := f.opts.JS.Consumer(ctx, f.opts.Stream, f.opts.Durable)
	if err != nil {
		return false, fmt.Errorf("consumer %s: %w", f.opts.Durable, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("consumer %s: %w", f.opts.Durable, err)
	}
	if info.AckFloor.Stream > f.floor {
		at, err := f.eventAt(ctx, info.AckFloor.Stream)
		if err != nil {
			return false, err
		}
		f.floor, f.floorAt = info.AckFloor.Stream, at
	}
	switch {
	case f.floor == 0:
		return false, nil
	case f.floorAt.node == node && f.floorAt.seq+1 >= seq:
		return true, nil
	case sseq <= f.floor:
		return true, nil
	}
	removed, err := f.removedSince(ctx, f.floor, sseq)
	return !removed && err == nil, err
}

// removedSince reports whether the stream lost a message with a sequence
// from floor up to (not including) to, which leaves the floor proving
// nothing about the messages before to: deleted from the stream's middle
// between the two, or the floor itself gone below the stream's first
// sequence (an age or size limit, a purge). A durable created to start
// below the first sequence gets a floor just under it, past messages it
// never delivered; a floor that left the stream that way looks the same.
func (f *Feed) removedSince(ctx context.Context, floor, to uint64) (bool, error) {
	st, err := f.opts.JS.Stream(ctx, f.opts.Stream)
	if err != nil {
		return false, err
	}
	info, err := st.Info(ctx, jetstream.WithDeletedDetails(true))
	if err != nil {
		return false, fmt.Errorf("stream info: %w", err)
	}
	if info.State.FirstSeq > floor {
		return true, nil
	}
	for _, d := range info.State.Deleted {
		if d > floor && d < to {
			return true, nil
		}
	}
	return false, nil
}

func filtersOf(c jetstream.ConsumerConfig) []string {
	if c.FilterSubject != "" {
		return []string{c.FilterSubject}
	}
	return c.FilterSubjects
}

// verify decodes and checks msgs, dropping events already applied. On a
// gap it rebuilds the consumer once and returns errResetConsumer.
func (f *Feed) verify(ctx context.Context, msgs []delivered, evs []event.Event) ([]event.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := map[string]uint64{} // expected seq within this batch
	for _, m := range msgs {
		subj, sseq := m.subject, m.sseq
		node, ok := f.layout.NodeOf(subj)
		if !ok {
			return nil, &CorruptError{StreamSeq: sseq, Subject: subj, Err: errors.New("not a node subject")}
		}
		ev, err := event.Decode(m.data)
		if err != nil {
			return nil, &CorruptError{StreamSeq: sseq, Subject: subj, Err: err}
		}
		if ev.Node != node {
			return nil, &CorruptError{StreamSeq: sseq, Subject: subj, Err: fmt.Errorf("record of node %q", ev.Node)}
		}
		if _, err := stream.CheckMessage(m.header, &ev); err != nil {
			return nil, &CorruptError{StreamSeq: sseq, Subject: subj, Err: err}
		}
		want, ok := next[node]
		if !ok {
			p, known := f.pos[node]
			if !known {
				p = f.firstPosition(node)
				f.pos[node] = p
			}
			want = p + 1
		}
		switch {
		case ev.Seq < want:
			continue // applied before: a redelivery or a replay from the start
		case ev.Seq > want:
			ok, err := f.acknowledged(ctx, node, ev.Seq, sseq)
			if err != nil {
				return nil, err
			}
			if ok {
				break // applied: the events between left no trace
			}
			gap := &GapError{Node: node, Want: want, Got: ev.Seq}
			if f.reset || f.opts.Durable == "" {
				return nil, gap
			}
			f.reset = true
			f.log.Warn().Err(gap).Msg("rebuilding the durable consumer from the start of the stream")
			if err := f.opts.JS.DeleteConsumer(ctx, f.opts.Stream, f.opts.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return nil, fmt.Errorf("delete consumer for rebuild: %w", err)
			}
			return nil, errResetConsumer
		}
		// The payload aliases the message; the handler may keep it.
		evs = append(evs, ev)
		next[node] = ev.Seq + 1
	}
	return evs, nil
}
