package eventlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// FormatVersion is the newest on-disk layout this build writes and reads. It
// only goes up; Open ratchets an older log to it and refuses a newer one.
const FormatVersion uint32 = 1

// MaxAppendBytes bounds the encoded size of one Append, so one caller cannot
// push an unbounded batch through the WAL.
const MaxAppendBytes = 64 << 20

// pebbleFormat pins Pebble's own on-disk format instead of following whatever
// the library defaults to, so a dependency bump never silently ratchets the
// store. FormatWALSyncChunks (included) lets WAL replay tell a torn tail from
// corruption; TableFormatPebblev6 allows MinLZ block compression.
const pebbleFormat = pebble.FormatTableFormatV6

// Options configure Open.
type Options struct {
	// NodeID is stamped into every appended event's Node field and recorded in
	// the log on first open; opening with a different one fails with
	// *NodeError. Required unless ReadOnly (then the stored id is used).
	NodeID string
	Logger zerolog.Logger
	// FS is the filesystem Pebble uses; nil means the real disk. Tests pass
	// pebble's crashable MemFS.
	FS vfs.FS
	// ReadOnly opens an existing log for inspection (sbxctl): appends and
	// snapshots fail with ErrReadOnly and nothing on disk is changed.
	ReadOnly bool
	// CacheSize is Pebble's block cache in bytes (default 32 MiB).
	CacheSize int64
	// MemTableSize is Pebble's memtable size in bytes (default 64 MiB); larger
	// means fewer flushes under a steady append rate.
	MemTableSize uint64
	// RingSize is how many recent events are kept in memory for subscribers
	// (default 8192); a subscriber further behind reads from Pebble.
	RingSize int
}

// Log is a node's op log. All methods are safe for concurrent use.
type Log struct {
	dir      string
	node     string
	readOnly bool
	log      zerolog.Logger
	db       *pebble.DB

	gate gate

	// Appends queue requests under qmu; whoever holds commitMu commits them
	// and owns next, inflight, applied, scratch and key (see append.go).
	qmu      sync.Mutex
	queue    []*request
	kick     chan struct{} // wakes the committer goroutine
	commitMu sync.Mutex
	next     uint64             // next sequence to assign
	inflight map[event.OpID]*op // applied, not yet pruned after publication
	applied  []*op              // the same ops in sequence order, for pruning
	// appliedOps counts ordinary ops applied; read without commitMu by
	// Begin's op-index probe.
	appliedOps  atomic.Uint64
	keepApplied int         // see keepApplied in append.go
	scratch     []byte      // record encoding buffer
	key         []byte      // key encoding buffer
	syncCh      chan *group // committer -> syncer

	// pubMu guards publication: syncing, group sync results, op.reqs, failErr.
	pubMu    sync.Mutex
	syncing  []*group // applied groups in WAL order, not yet published
	durable  atomic.Uint64
	notify   atomic.Pointer[chan struct{}]
	poisoned atomic.Bool
	failErr  error // the WAL sync error that poisoned the log

	first  atomic.Uint64 // oldest retained sequence
	trunMu sync.Mutex    // serialises SaveSnapshot/TruncatePrefix

	ring     *ring
	closeCh  chan struct{} // closed by Close: wakes subscribers
	stop     chan struct{} // closed by Close once the gate drained: stops the committer
	workers  sync.WaitGroup
	closing  sync.Once
	closeErr error
}

// StoreOptions returns the Pebble options the log's store uses (0 sizes
// take the defaults), so that benchmarks measure raw Pebble on equal terms.
// The caller owns one reference to the returned Cache.
func StoreOptions(cacheSize int64, memTableSize uint64) *pebble.Options {
	if cacheSize <= 0 {
		cacheSize = 32 << 20
	}
	if memTableSize == 0 {
		memTableSize = 64 << 20
	}
	po := &pebble.Options{
		Cache:              pebble.NewCache(cacheSize),
		MemTableSize:       memTableSize,
		FormatMajorVersion: pebbleFormat,
	}
	// Replay reads records sequentially: MinLZ ("fastest") decompresses about
	// twice as fast as the default Snappy, and 32 KiB blocks halve the block
	// reads per event. The op index is probed by point lookups of new op ids
	// on every append; bloom filters keep a miss from reading blocks as the
	// log grows.
	po.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionFastest })
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		po.Levels[i].BlockSize = 32 << 10
	}
	return po
}

// Open opens (creating when absent, unless ReadOnly) the log in dir.
func Open(dir string, opts Options) (*Log, error) {
	if dir == "" {
		return nil, errors.New("eventlog: empty directory")
	}
	if opts.NodeID == "" && !opts.ReadOnly {
		return nil, errors.New("eventlog: Options.NodeID is required")
	}
	ringSize := opts.RingSize
	if ringSize <= 0 {
		ringSize = 8192
	}
	if opts.ReadOnly {
		fsys := opts.FS
		if fsys == nil {
			fsys = vfs.Default
		}
		if _, err := fsys.Stat(dir); err != nil {
			return nil, fmt.Errorf("eventlog: no log in %s: %w", dir, err)
		}
	}
	po := StoreOptions(opts.CacheSize, opts.MemTableSize)
	defer po.Cache.Unref()
	po.FS = opts.FS
	po.ReadOnly = opts.ReadOnly
	po.ErrorIfNotExists = opts.ReadOnly
	po.Logger = pebbleLogger{opts.Logger}
	db, err := pebble.Open(dir, po)
	if err != nil {
		if errors.Is(err, pebble.ErrDBDoesNotExist) {
			return nil, fmt.Errorf("eventlog: no log in %s: %w", dir, err)
		}
		return nil, fmt.Errorf("eventlog: open %s: %w", dir, err)
	}
	l := &Log{
		dir:         dir,
		readOnly:    opts.ReadOnly,
		log:         opts.Logger,
		db:          db,
		inflight:    map[event.OpID]*op{},
		keepApplied: keepApplied,
		ring:        newRing(ringSize),
		closeCh:     make(chan struct{}),
		stop:        make(chan struct{}),
		kick:        make(chan struct{}, 1),
		syncCh:      make(chan *group, 64),
	}
	ch := make(chan struct{})
	l.notify.Store(&ch)
	if err := l.loadMeta(opts.NodeID); err != nil {
		_ = db.Close()
		return nil, err
	}
	if !l.readOnly {
		l.spawn(l.commitLoop)
		l.spawn(l.syncLoop)
	}
	return l, nil
}

// spawn runs fn on a goroutine that Close waits for. Every goroutine of the
// log starts here.
func (l *Log) spawn(fn func()) { l.workers.Go(fn) }

// loadMeta checks or initialises the format version and node id, and finds
// the first and last sequences.
func (l *Log) loadMeta(node string) error {
	format, okFormat, err := l.getUint(keyFormat)
	if err != nil {
		return err
	}
	stored, okNode, err := l.get(keyNode)
	if err != nil {
		return err
	}
	switch {
	case okFormat && uint32(format) > FormatVersion:
		return &FormatError{Dir: l.dir, OnDisk: uint32(format), Supported: FormatVersion}
	case !okFormat:
		empty, err := l.isEmpty()
		if err != nil {
			return err
		}
		if !empty {
			return fmt.Errorf("eventlog: %s holds data but no format marker; not an sbxlog op log", l.dir)
		}
	}
	if okNode && node != "" && string(stored) != node {
		return &NodeError{Dir: l.dir, Stored: string(stored), Given: node}
	}
	if node == "" {
		node = string(stored)
	}
	l.node = node
	if !l.readOnly && (!okFormat || uint32(format) < FormatVersion || !okNode) {
		// Future format upgrades migrate here, before the marker ratchets.
		b := l.db.NewBatch()
		_ = b.Set(keyFormat, binary.BigEndian.AppendUint32(nil, FormatVersion), nil)
		_ = b.Set(keyNode, []byte(node), nil)
		err := b.Commit(pebble.Sync)
		_ = b.Close()
		if err != nil {
			return fmt.Errorf("eventlog: write format marker: %w", err)
		}
	}
	if !okFormat && l.readOnly {
		return fmt.Errorf("eventlog: %s is empty (no format marker)", l.dir)
	}

	first, ok, err := l.getUint(keyFirst)
	if err != nil {
		return err
	}
	if !ok {
		first = 1
	}
	l.first.Store(first)
	last, err := l.lastStoredSeq()
	if err != nil {
		return err
	}
	if last == 0 {
		last = first - 1
	}
	l.next = last + 1
	l.durable.Store(last)
	l.ring.reset(last + 1)
	return nil
}

func (l *Log) isEmpty() (bool, error) {
	it, err := l.db.NewIter(nil)
	if err != nil {
		return false, err
	}
	empty := !it.First()
	return empty, errors.Join(it.Error(), it.Close())
}

func (l *Log) lastStoredSeq() (uint64, error) {
	it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixEvent}, UpperBound: []byte{prefixEvent + 1}})
	if err != nil {
		return 0, err
	}
	var seq uint64
	if it.Last() {
		if len(it.Key()) != 9 {
			err = &CorruptError{Err: fmt.Errorf("malformed event key %x", it.Key())}
		} else {
			seq = binary.BigEndian.Uint64(it.Key()[1:])
		}
	}
	return seq, errors.Join(err, it.Error(), it.Close())
}

func (l *Log) get(key []byte) ([]byte, bool, error) { return getFrom(l.db, key) }

// getFrom returns a copy of key's value, and whether it exists.
func getFrom(r pebble.Reader, key []byte) ([]byte, bool, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("eventlog: get %q: %w", key, err)
	}
	out := append([]byte(nil), v...)
	return out, true, closer.Close()
}

func (l *Log) getUint(key []byte) (uint64, bool, error) {
	v, ok, err := l.get(key)
	if !ok || err != nil {
		return 0, ok, err
	}
	switch len(v) {
	case 4:
		return uint64(binary.BigEndian.Uint32(v)), true, nil
	case 8:
		return binary.BigEndian.Uint64(v), true, nil
	}
	return 0, false, fmt.Errorf("eventlog: malformed %q value (%d bytes)", key, len(v))
}

// Dir returns the log's directory.
func (l *Log) Dir() string { return l.dir }

// NodeID returns the node id stamped into appended events.
func (l *Log) NodeID() string { return l.node }

// Close wakes subscribers with ErrClosed, waits for calls in progress, stops
// the committer and syncer (every applied batch is synced first) and closes
// Pebble. It is idempotent; later calls return the first result.
func (l *Log) Close() error {
	l.closing.Do(func() {
		close(l.closeCh)
		l.gate.close()
		close(l.stop)
		l.workers.Wait()
		l.closeErr = l.db.Close()
	})
	return l.closeErr
}

// Key layout; see doc.go.
const (
	prefixEvent    = 'e'
	prefixOp       = 'o'
	prefixSnapshot = 's'
)

var (
	keyFormat = []byte("m/format")
	keyNode   = []byte("m/node")
	keyFirst  = []byte("m/first")
)

// EventKey returns the Pebble key of the record with sequence seq. It is part
// of the documented on-disk layout, for tools and tests that inspect a log.
func EventKey(seq uint64) []byte { return appendSeqKey(make([]byte, 0, 9), prefixEvent, seq) }

func appendSeqKey(dst []byte, prefix byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, prefix), seq)
}

func opKey(id event.OpID) []byte {
	k := make([]byte, 17)
	k[0] = prefixOp
	copy(k[1:], id[:])
	return k
}

// gate admits calls until Close, then waits for admitted ones to leave.
// Pebble panics on use after Close, so every use of db passes through it.
type gate struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{}
}

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

func (g *gate) exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.closed && g.n == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	if g.n == 0 {
		g.mu.Unlock()
		return
	}
	idle := make(chan struct{})
	g.idle = idle
	g.mu.Unlock()
	<-idle
}

// pebbleLogger routes Pebble's logging into zerolog. Pebble's Info lines
// (WAL recovery, flushes) are routine, so they go to Debug.
type pebbleLogger struct{ l zerolog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug().Str("component", "pebble").Msgf(format, args...)
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error().Str("component", "pebble").Msgf(format, args...)
}

// Fatalf must not return (Pebble relies on it). zerolog's Fatal exits, but
// only if the level is enabled, hence the explicit panic afterwards.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error().Str("component", "pebble").Msgf(format, args...)
	panic(fmt.Sprintf("pebble: "+format, args...))
}
