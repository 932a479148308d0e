package silkagent

import (
	"path"
	"strings"
	"sync"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Watcher is what fs_watch needs of a file tree; an FS that is not one
// leaves fs_watch unimplemented.
type Watcher interface {
	// Watch reports the changes of p (a file, or a directory's entries, and
	// with recursive those of every directory below it) through emit until
	// stop is called. It returns once the watch is armed: every change after
	// it is reported. emit must not block. A failure of the running watch
	// goes to fail, which ends it.
	Watch(p string, recursive bool, emit func(silkd.Event), fail func(error)) (stop func(), err error)
}

// overflowMessage is the old agent's text for a watch the client did not
// keep up with.
const overflowMessage = "watch event queue overflow"

// fsWatch runs fs_watch: ready once the watch is armed, then event frames
// until the client's input ends (any frame, or the end of its stream),
// which ends the RPC without a terminal frame, as the old agent's watch
// ended. Events wait for the client in a queue of WatchQueue; past it the
// events already queued are sent and the watch ends with an internal
// error, as does a failure of the watch itself.
func (s *Server) fsWatch(req *silkd.FsWatch, w *silkd.Writer) *call {
	if req.Path == "" {
		_ = w.WriteResponse(badRequest("fs_watch: path must not be empty"))
		return finished()
	}
	limits := s.Limits.withDefaults()
	queue := make(chan silkd.Event, limits.WatchQueue)
	overflow := make(chan struct{})
	var overflowOnce sync.Once
	failed := make(chan error, 1)
	emit := func(ev silkd.Event) {
		select {
		case queue <- ev:
		default:
			overflowOnce.Do(func() { close(overflow) })
		}
	}
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	stop, err := s.FS.(Watcher).Watch(req.Path, req.Recursive, emit, fail)
	if err != nil {
		_ = w.WriteResponse(errFrame(silkd.OpFsWatch, err))
		return finished()
	}
	if err := w.WriteResponse(silkd.Ready{}); err != nil {
		stop()
		return finished()
	}
	c := &call{done: make(chan struct{})}
	ended := make(chan struct{})
	c.feed = func(silkd.Request) { c.end() }
	c.endFn = func() { close(ended) }
	go func() {
		defer c.finish()
		defer stop()
		for {
			select {
			case ev := <-queue:
				if err := w.WriteResponse(ev); err != nil {
					return
				}
				continue
			default:
			}
			select {
			case ev := <-queue:
				if err := w.WriteResponse(ev); err != nil {
					return
				}
			case <-overflow:
				for len(queue) > 0 {
					if err := w.WriteResponse(<-queue); err != nil {
						return
					}
				}
				_ = w.WriteResponse(silkd.Errorf(silkd.KindInternal, overflowMessage))
				return
			case err := <-failed:
				_ = w.WriteResponse(silkd.Errorf(silkd.KindInternal, "fs_watch: %v", err))
				return
			case <-ended:
				return
			}
		}
	}()
	return c
}

// memWatch is one watch of a MemFS.
type memWatch struct {
	root      string
	recursive bool
	emit      func(silkd.Event)
}

// covers reports whether a change of p is this watch's.
func (w *memWatch) covers(p string) bool {
	switch {
	case p == w.root:
		return true
	case w.recursive:
		return strings.HasPrefix(p, strings.TrimSuffix(w.root, "/")+"/")
	}
	return path.Dir(p) == w.root
}

// Watch implements Watcher: every change the MemFS makes (fs ops, uploads,
// pushes) is reported to the watches that cover it, in order.
func (m *MemFS) Watch(p string, recursive bool, emit func(silkd.Event), _ func(error)) (func(), error) {
	p = clean(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.nodes[p]; !ok {
		return nil, notExist("watch", p)
	}
	w := &memWatch{root: p, recursive: recursive, emit: emit}
	if m.watches == nil {
		m.watches = map[*memWatch]struct{}{}
	}
	m.watches[w] = struct{}{}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.watches, w)
	}, nil
}

// notify reports a change of p to the watches (under m.mu).
func (m *MemFS) notify(kind, p string) {
	for w := range m.watches {
		if w.covers(p) {
			w.emit(silkd.Event{Kind: kind, Path: p})
		}
	}
}
