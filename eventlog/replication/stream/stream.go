// Package stream names and checks the JetStream stream that carries every
// node's op log: one stream (default SBX_EVENTS), one subject per node
// (<prefix>.<token>, default prefix sbx.ev, token: the node id as a subject
// token, see Token), file storage, limits retention, a duplicate window for
// the replicator's message ids, and 1 replica embedded or 3 in a cluster.
//
// Ensure creates the stream when it is missing and otherwise checks the
// settings replication depends on. An existing stream whose settings would
// lose, reorder or silently drop events is refused with *IncompatibleError
// naming the setting, what the stream has and what sbxlog needs. Settings
// that are compatible but not what sbxlog would create (more replicas than
// configured, an age, size or count limit an operator added) are accepted
// with a warning each. Ensure never edits a stream an operator may have
// configured on purpose.
package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
)

const (
	// DefaultName is the stream's default name.
	DefaultName = "SBX_EVENTS"
	// DefaultSubjectPrefix is the default subject prefix: a node's subject
	// is the prefix, a dot, and the node's token.
	DefaultSubjectPrefix = "sbx.ev"
	// SubjectPrefix is the default prefix followed by its dot.
	SubjectPrefix = DefaultSubjectPrefix + "."
	// AllSubjects matches every node's subject under the default prefix.
	AllSubjects = SubjectPrefix + "*"
	// DefaultDuplicates is the default duplicate window. It must outlast any
	// period a publish can be retried for; the replicator re-reads its resume
	// point from the stream after every failure, so retries are short.
	DefaultDuplicates = 2 * time.Minute
	// MaxNodeID is the longest node id in bytes.
	MaxNodeID = 128
	// MaxToken is the longest subject token of a node id: JetStream names
	// are at most 255 bytes, and durable consumer names are a short word,
	// a dash and the token ("follower-<token>").
	MaxToken = 240
	// tokenEscape starts an escaped byte in a token. It is valid in
	// subjects, consumer names and KV keys alike, and not in the plain
	// alphabet, so escaped tokens never collide with plain ones.
	tokenEscape = '='
)

// ErrBadNodeID means a string cannot be a node id (or, for CheckToken, a
// plain subject token).
var ErrBadNodeID = errors.New("stream: node id is not a valid subject token")

// plain reports whether c stands for itself in a token.
func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// CheckToken reports whether tok is a plain subject token: non-empty, at
// most 128 bytes of letters, digits, '-' and '_' (no '.', wildcards or
// spaces, which would change a subject's meaning). Durable consumer names
// follow this rule, and so does every node id that is its own token.
func CheckToken(tok string) error {
	if tok == "" || len(tok) > MaxNodeID {
		return fmt.Errorf("%w: %q (1..%d bytes)", ErrBadNodeID, tok, MaxNodeID)
	}
	for _, c := range []byte(tok) {
		if !plain(c) {
			return fmt.Errorf("%w: %q (byte %q; allowed: letters, digits, '-', '_')", ErrBadNodeID, tok, c)
		}
	}
	return nil
}

// CheckDurable reports whether name can name a durable consumer: 1..255
// bytes of letters, digits, '-', '_' and '=' (the characters of tokens, so
// "audit-" + Token(node) qualifies).
func CheckDurable(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("stream: durable name %q: 1..255 bytes", name)
	}
	for _, c := range []byte(name) {
		if !plain(c) && c != tokenEscape {
			return fmt.Errorf("stream: durable name %q: byte %q (allowed: letters, digits, '-', '_', '=')", name, c)
		}
	}
	return nil
}

// CheckNodeID reports whether node can be a node id: 1..MaxNodeID bytes of
// printable UTF-8 (letters, digits, punctuation, symbols, spaces; no
// control characters), whose token (Token) is at most MaxToken bytes. Any
// host name qualifies.
func CheckNodeID(node string) error {
	switch {
	case node == "" || len(node) > MaxNodeID:
		return fmt.Errorf("%w: %q (1..%d bytes)", ErrBadNodeID, node, MaxNodeID)
	case !utf8.ValidString(node):
		return fmt.Errorf("%w: %q is not UTF-8", ErrBadNodeID, node)
	}
	for _, r := range node {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %q (character %q is not printable)", ErrBadNodeID, node, r)
		}
	}
	if t := Token(node); len(t) > MaxToken {
		return fmt.Errorf("%w: %q (its subject token %q is %d bytes, above %d)", ErrBadNodeID, node, t, len(t), MaxToken)
	}
	return nil
}

// Token is node's subject token: letters, digits, '-' and '_' stand for
// themselves and every other byte of the id (its UTF-8 encoding) is written
// as '=' and two upper-case hex digits, so "host.example.com" is
// "host=2Eexample=2Ecom". The mapping is deterministic and reversible
// (NodeOfToken), and an id of the plain alphabet is its own token, which
// is every id earlier releases accepted.
func Token(node string) string {
	n := 0
	for _, c := range []byte(node) {
		if !plain(c) {
			n++
		}
	}
	if n == 0 {
		return node
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(node)+2*n)
	for _, c := range []byte(node) {
		if plain(c) {
			b = append(b, c)
			continue
		}
		b = append(b, tokenEscape, hex[c>>4], hex[c&15])
	}
	return string(b)
}

// NodeOfToken is Token's inverse. It refuses strings Token never returns
// (a bad escape, a lower-case hex digit, an escaped plain byte, an id that
// fails CheckNodeID), so each node has exactly one token.
func NodeOfToken(tok string) (string, bool) {
	if strings.IndexByte(tok, tokenEscape) < 0 {
		return tok, CheckToken(tok) == nil
	}
	b := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if plain(c) {
			b = append(b, c)
			continue
		}
		if c != tokenEscape || i+2 >= len(tok) {
			return "", false
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil || plain(byte(v)) || strings.ToUpper(tok[i+1:i+3]) != tok[i+1:i+3] {
			return "", false
		}
		b = append(b, byte(v))
		i += 2
	}
	node := string(b)
	if CheckNodeID(node) != nil {
		return "", false
	}
	return node, true
}

// CheckSubjectPrefix reports whether p can prefix node subjects: one or
// more dot-separated tokens of printable characters without whitespace or
// wildcards, and no leading, trailing or doubled dot ("sbx.ev", not
// "sbx.ev.").
func CheckSubjectPrefix(p string) error {
	if p == "" || len(p) > 200 {
		return fmt.Errorf("stream: subject prefix %q: 1..200 bytes", p)
	}
	for _, t := range strings.Split(p, ".") {
		if t == "" {
			return fmt.Errorf("stream: subject prefix %q has an empty token (no leading, trailing or doubled '.'; e.g. %s)", p, DefaultSubjectPrefix)
		}
		for _, r := range t {
			if r == '*' || r == '>' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
				return fmt.Errorf("stream: subject prefix %q: character %q is not allowed (no wildcards or whitespace)", p, r)
			}
		}
	}
	return nil
}

// Subject is node's subject under the default prefix.
func Subject(node string) string { return Config{}.Subject(node) }

// NodeOf returns the node id of a node subject under the default prefix.
func NodeOf(subject string) (string, bool) { return Config{}.NodeOf(subject) }

// MsgID is the Nats-Msg-Id of a node's event seq: the node's token, "-",
// and seq.
func MsgID(node string, seq uint64) string { return Token(node) + "-" + strconv.FormatUint(seq, 10) }

// SeqOfMsgID returns the event sequence of node's message id.
func SeqOfMsgID(node, id string) (uint64, bool) {
	s, ok := strings.CutPrefix(id, Token(node)+"-")
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id != MsgID(node, seq) {
		return 0, false
	}
	return seq, true
}

// Config is what sbxlog asks of the stream and where it finds the nodes'
// subjects.
type Config struct {
	// Name (default DefaultName).
	Name string
	// SubjectPrefix (default DefaultSubjectPrefix): node subjects are
	// SubjectPrefix + "." + Token(node). See CheckSubjectPrefix.
	SubjectPrefix string
	// Replicas: 1 embedded, 3 in a cluster (default 1). A stream created by
	// Ensure gets this many; an existing one may have more.
	Replicas int
	// Duplicates is the duplicate window (default DefaultDuplicates). An
	// existing stream with a longer window is accepted.
	Duplicates time.Duration
}

// StreamName is the stream's name (Name or the default).
func (c Config) StreamName() string {
	if c.Name == "" {
		return DefaultName
	}
	return c.Name
}

// Prefix is the subject prefix (SubjectPrefix or the default).
func (c Config) Prefix() string {
	if c.SubjectPrefix == "" {
		return DefaultSubjectPrefix
	}
	return c.SubjectPrefix
}

// Subject is node's subject.
func (c Config) Subject(node string) string { return c.Prefix() + "." + Token(node) }

// Wildcard matches every node's subject.
func (c Config) Wildcard() string { return c.Prefix() + ".*" }

// NodeOf returns the node id of a node subject.
func (c Config) NodeOf(subject string) (string, bool) {
	tok, ok := strings.CutPrefix(subject, c.Prefix()+".")
	if !ok {
		return "", false
	}
	return NodeOfToken(tok)
}

// CheckName reports whether name can name a stream: not empty, at most 255
// bytes, none of '.', '*', '>', whitespace or path separators.
func CheckName(name string) error {
	if name == "" || len(name) > 255 || strings.ContainsAny(name, ".*>/\\ \t\r\n\f") {
		return fmt.Errorf("stream: bad stream name %q (1..255 bytes, none of '.', '*', '>', '/', '\\', whitespace)", name)
	}
	return nil
}

func (c Config) withDefaults() (Config, error) {
	c.Name, c.SubjectPrefix = c.StreamName(), c.Prefix()
	if err := CheckName(c.Name); err != nil {
		return c, err
	}
	if err := CheckSubjectPrefix(c.SubjectPrefix); err != nil {
		return c, err
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

// Validate reports what StreamConfig would refuse.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
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
		Subjects:          []string{c.Wildcard()},
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
		// Any replica answers direct gets, with no consumer and no
		// leader: the cluster view reads through them while its consumer
		// cannot be re-created (feed.Options.DirectReads).
		AllowDirect: true,
	}, nil
}

// IncompatibleError says which setting of an existing stream stops sbxlog
// from using it.
type IncompatibleError struct {
	Stream  string
	Setting string
	Have    string
	Want    string
	// Fix is what to do about it, when there is more to say than the
	// general advice.
	Fix string
}

func (e *IncompatibleError) Error() string {
	fix := e.Fix
	if fix == "" {
		fix = "edit the stream (nats stream edit " + e.Stream + "), or use another stream: nats.stream in sandboxd's config, --stream for sbxctl"
	}
	return fmt.Sprintf("stream %s exists with incompatible setting %s: has %s, sbxlog needs %s (%s)",
		e.Stream, e.Setting, e.Have, e.Want, fix)
}

// Ensured is the stream Ensure found or created.
type Ensured struct {
	jetstream.Stream
	// Have is the stream's configuration.
	Have jetstream.StreamConfig
	// Created is when the server created the stream: a stream deleted and
	// created again under the same name has a new one.
	Created time.Time
	// Warnings name the compatible settings that differ from what sbxlog
	// would create (see Warnings).
	Warnings []string
}

// Ensure creates the stream if it is missing and checks it otherwise. Safe to
// race with other nodes doing the same.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) (*Ensured, error) {
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
			return &Ensured{Stream: s, Have: info.Config, Created: info.Created, Warnings: Warnings(info.Config, want)}, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("stream %s: lookup: %w", want.Name, err)
		}
		s, err = js.CreateStream(ctx, want)
		if err == nil {
			info := s.CachedInfo()
			return &Ensured{Stream: s, Have: info.Config, Created: info.Created}, nil
		}
		// Another node created it between lookup and create: check theirs.
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && attempt == 0 {
			continue
		}
		return nil, fmt.Errorf("stream %s: create: %w", want.Name, err)
	}
}

// Check compares an existing stream's configuration with what sbxlog needs
// and returns *IncompatibleError for the first setting that stops
// replication. More replicas than asked for, and age, size or count limits
// are compatible (see Warnings).
func Check(have, want jetstream.StreamConfig) error {
	bad := func(setting string, h, w any) *IncompatibleError {
		return &IncompatibleError{Stream: want.Name, Setting: setting, Have: fmt.Sprint(h), Want: fmt.Sprint(w)}
	}
	for _, ws := range want.Subjects {
		if !covered(have.Subjects, ws) {
			e := bad("subjects", fmt.Sprintf("%q", have.Subjects), fmt.Sprintf("a subject covering %q", ws))
			e.Fix = "add the subject to the stream, or set the subject prefix (nats.subject_prefix, --subject-prefix) to the one the stream carries"
			return e
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
	case have.Replicas < want.Replicas:
		e := bad("replicas", have.Replicas, want.Replicas)
		e.Fix = fmt.Sprintf("raise the stream's replicas (nats stream edit %s --replicas %d), or lower nats.replicas to %d", want.Name, want.Replicas, have.Replicas)
		return e
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

// Warnings lists the settings of a stream Check accepts that differ from
// what sbxlog creates and change what the stream keeps: more replicas than
// configured, and limits that remove events (max_age, max_msgs, max_bytes)
// or refuse publishes (discard new). Removed events are missing for any
// consumer that starts later (a new follower finds a gap); the replicator
// never publishes them again.
func Warnings(have, want jetstream.StreamConfig) []string {
	var w []string
	if have.Replicas > want.Replicas {
		w = append(w, fmt.Sprintf("stream %s has %d replicas, this node is configured for %d: using the stream's", want.Name, have.Replicas, want.Replicas))
	}
	removes := ""
	switch {
	case have.MaxAge > 0:
		removes = fmt.Sprintf("max_age %s", have.MaxAge)
	case have.MaxMsgs > 0:
		removes = fmt.Sprintf("max_msgs %d", have.MaxMsgs)
	case have.MaxBytes > 0:
		removes = fmt.Sprintf("max_bytes %d", have.MaxBytes)
	}
	if want.AllowDirect && !have.AllowDirect {
		w = append(w, fmt.Sprintf("stream %s does not allow direct gets: through a NATS server's loss the cluster view waits for its consumer to be re-created (nats stream edit %s --allow-direct)", want.Name, want.Name))
	}
	if removes != "" {
		if have.Discard == jetstream.DiscardNew {
			w = append(w, fmt.Sprintf("stream %s has %s with discard new: publishes are refused once it is full, and replication stalls until room is made", want.Name, removes))
		} else {
			w = append(w, fmt.Sprintf("stream %s has %s: older events leave the stream, and a consumer starting later (a new follower) cannot get them; they are not published again", want.Name, removes))
		}
	}
	return w
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

// Ends is Config{Name: name}.Ends.
func Ends(ctx context.Context, js jetstream.JetStream, name string, nodes []string) (map[string]End, error) {
	return Config{Name: name}.Ends(ctx, js, nodes)
}

// Ends returns, per node, where its subject in the stream ends: where a
// consumer that should stop "at the end" stops. An empty nodes means every
// node with a subject in the stream. The event sequence is read from the
// last message's Nats-Msg-Id.
func (c Config) Ends(ctx context.Context, js jetstream.JetStream, nodes []string) (map[string]End, error) {
	name := c.StreamName()
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	if len(nodes) == 0 {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(c.Wildcard()))
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		for subj := range info.State.Subjects {
			if n, ok := c.NodeOf(subj); ok {
				nodes = append(nodes, n)
			}
		}
	}
	out := make(map[string]End, len(nodes))
	for _, n := range nodes {
		if err := CheckNodeID(n); err != nil {
			return nil, err
		}
		m, err := LeaderGet(ctx, js, name, GetRequest{LastBySubject: c.Subject(n)})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			out[n] = End{}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: last message of %s: %w", name, n, err)
		}
		seq, err := seqOf(name, "last", n, m)
		if err != nil {
			return nil, err
		}
		out[n] = End{Seq: seq, StreamSeq: m.Sequence}
	}
	return out, nil
}

// Start is where a node's subject starts in the stream.
type Start struct {
	// Seq is the node's first event sequence in the stream (0: no message).
	Seq uint64
	// StreamSeq is that message's stream sequence.
	StreamSeq uint64
	// Removed is the last stream sequence that left the stream from its
	// head (an age or size limit, a purge): the stream's first sequence
	// minus one (0: none left it).
	Removed uint64
}

// Start returns where node's subject starts in the stream, and how much of
// the stream's head is gone: a consumer that must begin at the node's
// event 1 (a follower's fresh replica) can tell that its events left the
// stream instead of taking an empty subject for a node that published
// nothing. The event sequence is read from the message's Nats-Msg-Id.
func (c Config) Start(ctx context.Context, js jetstream.JetStream, node string) (Start, error) {
	if err := CheckNodeID(node); err != nil {
		return Start{}, err
	}
	name := c.StreamName()
	st, err := js.Stream(ctx, name)
	if err != nil {
		return Start{}, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return Start{}, fmt.Errorf("stream %s: %w", name, err)
	}
	var out Start
	if info.State.FirstSeq > 1 {
		out.Removed = info.State.FirstSeq - 1
	}
	m, err := LeaderGet(ctx, js, name, GetRequest{Seq: 1, NextBySubject: c.Subject(node)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return out, nil
	}
	if err != nil {
		return Start{}, fmt.Errorf("stream %s: first message of %s: %w", name, node, err)
	}
	seq, err := seqOf(name, "first", node, m)
	if err != nil {
		return Start{}, err
	}
	out.Seq, out.StreamSeq = seq, m.Sequence
	return out, nil
}

// seqOf is the event sequence of node's message m (its which message in
// stream name), read from its Nats-Msg-Id.
func seqOf(name, which, node string, m *jetstream.RawStreamMsg) (uint64, error) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	seq, ok := SeqOfMsgID(node, id)
	if !ok {
		return 0, fmt.Errorf("stream %s: %s message of %s (stream seq %d) has message id %q, not %s-<seq>", name, which, node, m.Sequence, id, Token(node))
	}
	return seq, nil
}

// Whole reports whether stream name (any stream: the op log, a KV bucket's
// KV_<bucket>) has a leader and replicas-1 other replicas, each current and
// online: after a server's loss, whether the cluster has healed. Errors
// (the stream or its leader unreachable) count as not whole.
func Whole(ctx context.Context, js jetstream.JetStream, name string, replicas int) bool {
	st, err := js.Stream(ctx, name)
	if err != nil {
		return false
	}
	info, err := st.Info(ctx)
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != replicas-1 {
		return false
	}
	for _, r := range info.Cluster.Replicas {
		if !r.Current || r.Offline {
			return false
		}
	}
	return true
}
