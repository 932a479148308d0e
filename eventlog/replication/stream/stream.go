// Package stream names and checks the JetStream stream that carries every
// node's op log: one stream (default SBX_EVENTS), one subject per node
// (sbx.ev.<node>), file storage, limits retention, a duplicate window for the
// replicator's message ids, and 1 replica embedded or 3 in a cluster.
//
// Ensure creates the stream when it is missing and otherwise checks the
// settings replication depends on. An existing stream whose settings would
// lose, reorder or silently drop events is refused with *IncompatibleError
// naming the setting, what the stream has and what sbxlog needs: Ensure never
// edits a stream an operator may have configured on purpose.
package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

const (
	// DefaultName is the stream's default name.
	DefaultName = "SBX_EVENTS"
	// SubjectPrefix is followed by a node id to form its subject.
	SubjectPrefix = "sbx.ev."
	// AllSubjects matches every node's subject.
	AllSubjects = SubjectPrefix + "*"
	// DefaultDuplicates is the default duplicate window. It must outlast any
	// period a publish can be retried for; the replicator re-reads its resume
	// point from the stream after every failure, so retries are short.
	DefaultDuplicates = 2 * time.Minute
)

// ErrBadNodeID means a node id cannot be a subject token.
var ErrBadNodeID = errors.New("stream: node id is not a valid subject token")

// CheckNodeID reports whether node can name a subject: non-empty, at most 128
// bytes of letters, digits, '-' and '_' (no '.', wildcards or spaces, which
// would change the subject's meaning).
func CheckNodeID(node string) error {
	if node == "" || len(node) > 128 {
		return fmt.Errorf("%w: %q (1..128 bytes)", ErrBadNodeID, node)
	}
	for _, c := range []byte(node) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return fmt.Errorf("%w: %q (byte %q; allowed: letters, digits, '-', '_')", ErrBadNodeID, node, c)
		}
	}
	return nil
}

// Subject is node's subject.
func Subject(node string) string { return SubjectPrefix + node }

// NodeOf returns the node id of a node subject.
func NodeOf(subject string) (string, bool) {
	node, ok := strings.CutPrefix(subject, SubjectPrefix)
	if !ok || CheckNodeID(node) != nil {
		return "", false
	}
	return node, true
}

// MsgID is the Nats-Msg-Id of a node's event seq: node + "-" + seq.
func MsgID(node string, seq uint64) string { return fmt.Sprintf("%s-%d", node, seq) }

// Config is what sbxlog asks of the stream.
type Config struct {
	// Name (default DefaultName).
	Name string
	// Replicas: 1 embedded, 3 in a cluster (default 1).
	Replicas int
	// Duplicates is the duplicate window (default DefaultDuplicates). An
	// existing stream with a longer window is accepted.
	Duplicates time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if strings.ContainsAny(c.Name, ".*> \t") {
		return c, fmt.Errorf("stream: bad stream name %q", c.Name)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return c, fmt.Errorf("stream: replicas %d out of [1, 5]", c.Replicas)
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.Duplicates < time.Second {
		return c, fmt.Errorf("stream: duplicate window %s shorter than 1s", c.Duplicates)
	}
	return c, nil
}

// StreamConfig is the JetStream configuration Ensure creates.
func (c Config) StreamConfig() (jetstream.StreamConfig, error) {
	c, err := c.withDefaults()
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	return jetstream.StreamConfig{
		Name:              c.Name,
		Description:       "sbxlog op logs, one subject per node",
		Subjects:          []string{AllSubjects},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas,
		Duplicates:        c.Duplicates,
		Discard:           jetstream.DiscardOld,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: -1,
		// Single events are never deleted by hand: a hole would be a gap
		// every follower refuses.
		DenyDelete: true,
		// The replicator publishes a window as one atomic batch when the
		// stream has several replicas.
		AllowAtomicPublish: true,
	}, nil
}

// IncompatibleError says which setting of an existing stream stops sbxlog
// from using it.
type IncompatibleError struct {
	Stream  string
	Setting string
	Have    string
	Want    string
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("stream %s exists with incompatible setting %s: has %s, sbxlog needs %s (edit or remove the stream, or point sbxlog at another stream name)",
		e.Stream, e.Setting, e.Have, e.Want)
}

// Ensure creates the stream if it is missing and checks it otherwise. Safe to
// race with other nodes doing the same.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	want, err := cfg.StreamConfig()
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		s, err := js.Stream(ctx, want.Name)
		if err == nil {
			info, err := s.Info(ctx)
			if err != nil {
				return nil, fmt.Errorf("stream %s: info: %w", want.Name, err)
			}
			if err := Check(info.Config, want); err != nil {
				return nil, err
			}
			return s, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("stream %s: lookup: %w", want.Name, err)
		}
		s, err = js.CreateStream(ctx, want)
		if err == nil {
			return s, nil
		}
		// Another node created it between lookup and create: check theirs.
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && attempt == 0 {
			continue
		}
		return nil, fmt.Errorf("stream %s: create: %w", want.Name, err)
	}
}

// Check compares an existing stream's configuration with what sbxlog needs
// and returns *IncompatibleError for the first setting that differs.
func Check(have, want jetstream.StreamConfig) error {
	bad := func(setting string, h, w any) error {
		return &IncompatibleError{Stream: want.Name, Setting: setting, Have: fmt.Sprint(h), Want: fmt.Sprint(w)}
	}
	for _, ws := range want.Subjects {
		if !covered(have.Subjects, ws) {
			return bad("subjects", fmt.Sprintf("%q", have.Subjects), fmt.Sprintf("a subject covering %q", ws))
		}
	}
	switch {
	case have.Mirror != nil:
		return bad("mirror", "a mirror of "+have.Mirror.Name, "no mirror (the stream takes publishes)")
	case have.Sealed:
		return bad("sealed", true, false)
	case have.NoAck:
		return bad("no_ack", true, "false (the replicator needs acks)")
	case have.Retention != want.Retention:
		return bad("retention", have.Retention, want.Retention)
	case have.Storage != want.Storage:
		return bad("storage", have.Storage, want.Storage)
	case have.Replicas != want.Replicas:
		return bad("replicas", have.Replicas, want.Replicas)
	case have.Duplicates < want.Duplicates:
		return bad("duplicate_window", have.Duplicates, fmt.Sprintf("at least %s", want.Duplicates))
	case have.MaxMsgsPerSubject > 0:
		return bad("max_msgs_per_subject", have.MaxMsgsPerSubject, "unlimited (-1)")
	case have.PersistMode != jetstream.DefaultPersistMode:
		return bad("persist_mode", have.PersistMode, "default (acknowledge after the write)")
	case want.AllowAtomicPublish && !have.AllowAtomicPublish:
		return bad("allow_atomic", false, "true (atomic batch publish, nats-server 2.12 or later)")
	}
	return nil
}

// covered reports whether one of the patterns matches every subject the
// pattern want matches.
func covered(patterns []string, want string) bool {
	for _, p := range patterns {
		if covers(p, want) {
			return true
		}
	}
	return false
}

func covers(p, w string) bool {
	pt, wt := strings.Split(p, "."), strings.Split(w, ".")
	for i, t := range pt {
		if t == ">" {
			return i < len(wt)
		}
		if i >= len(wt) {
			return false
		}
		switch {
		case t == "*":
			if wt[i] == ">" {
				return false
			}
		case t != wt[i]:
			return false
		}
	}
	return len(pt) == len(wt)
}

// End is where a node's subject ends in the stream.
type End struct {
	// Seq is the node's last event sequence (0: no message).
	Seq uint64
	// StreamSeq is that message's stream sequence.
	StreamSeq uint64
}

// Ends returns, per node, where its subject in stream name ends: where a
// consumer that should stop "at the end" stops. An empty nodes means every
// node with a subject in the stream. The event sequence is read from the
// last message's Nats-Msg-Id.
func Ends(ctx context.Context, js jetstream.JetStream, name string, nodes []string) (map[string]End, error) {
	if name == "" {
		name = DefaultName
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	if len(nodes) == 0 {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(AllSubjects))
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		for subj := range info.State.Subjects {
			if n, ok := NodeOf(subj); ok {
				nodes = append(nodes, n)
			}
		}
	}
	out := make(map[string]End, len(nodes))
	for _, n := range nodes {
		if err := CheckNodeID(n); err != nil {
			return nil, err
		}
		m, err := st.GetLastMsgForSubject(ctx, Subject(n))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			out[n] = End{}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: last message of %s: %w", name, n, err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		seq, err := strconv.ParseUint(strings.TrimPrefix(id, n+"-"), 10, 64)
		if err != nil || id != MsgID(n, seq) {
			return nil, fmt.Errorf("stream %s: last message of %s (stream seq %d) has message id %q, not %s-<seq>", name, n, m.Sequence, id, n)
		}
		out[n] = End{Seq: seq, StreamSeq: m.Sequence}
	}
	return out, nil
}
