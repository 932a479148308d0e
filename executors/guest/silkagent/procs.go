package silkagent

import (
	"context"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// The process table's ops: ps, logs and attach (kill is with exec).

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Server) lookup(op string, pid uint32) (*procEntry, *silkd.Error) {
	e, ok := s.table.get(pid)
	if !ok {
		return nil, silkd.Errorf(silkd.KindNotFound, "%s: no such pid %d", op, pid)
	}
	return e, nil
}

// writeChunks sends chunks as stdout and stderr frames.
func writeChunks(w *silkd.Writer, chunks []outChunk) error {
	for _, c := range chunks {
		if err := w.WriteBulk(c.kind, c.data); err != nil {
			return err
		}
	}
	return nil
}

// logs replays pid's log: its output, exit if it has ended, then done.
func (s *Server) logs(req *silkd.Logs, w *silkd.Writer) {
	e, ferr := s.lookup(silkd.OpLogs, req.Pid)
	if ferr != nil {
		_ = w.WriteResponse(ferr)
		return
	}
	chunks, _, ended, code, _ := e.out.since(0)
	if writeChunks(w, chunks) != nil {
		return
	}
	if ended {
		if w.WriteResponse(silkd.Exit{Code: code}) != nil {
			return
		}
	}
	_ = w.WriteResponse(silkd.Done{})
}

// attach replays pid's log and follows it to exit. It stops with done when
// the client sends anything else or goes away.
func (s *Server) attach(ctx context.Context, req *silkd.Attach, w *silkd.Writer) *call {
	e, ferr := s.lookup(silkd.OpAttach, req.Pid)
	if ferr != nil {
		_ = w.WriteResponse(ferr)
		return finished()
	}
	c := &call{done: make(chan struct{})}
	stop := make(chan struct{})
	c.endFn = func() { close(stop) }
	go func() {
		defer c.finish()
		var seq uint64
		for {
			chunks, next, ended, code, wake := e.out.since(seq)
			seq = next
			if writeChunks(w, chunks) != nil {
				return
			}
			if ended {
				_ = w.WriteResponse(silkd.Exit{Code: code})
				return
			}
			select {
			case <-wake:
			case <-stop:
				_ = w.WriteResponse(silkd.Done{})
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return c
}
