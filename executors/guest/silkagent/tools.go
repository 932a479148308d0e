package silkagent

import (
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// dispatchTools starts the RPC of a whole-tree, watch, git or lsp op, or
// returns nil when req is none of them or its backend is missing (the
// Server then answers unimplemented).
func (s *Server) dispatchTools(req silkd.Request, w *silkd.Writer) *call {
	answer := func(r silkd.Response, err error) *call {
		if err != nil {
			r = errFrame(req.Op(), err)
		}
		_ = w.WriteResponse(r)
		return finished()
	}
	// reply runs an op that writes its own frames and returns the error
	// that ends it, if any.
	reply := func(err error) *call {
		if err != nil {
			_ = w.WriteResponse(errFrame(req.Op(), err))
		}
		return finished()
	}
	_, watcher := s.FS.(Watcher)
	tree := s.tree() != nil
	switch v := req.(type) {
	case *silkd.FsPush:
		if tree {
			return s.fsPush(v, w)
		}
	case *silkd.FsPull:
		if tree {
			return reply(s.fsPull(v, w))
		}
	case *silkd.FsFind:
		if tree {
			return reply(s.fsFind(v, w))
		}
	case *silkd.FsReplace:
		if tree {
			return reply(s.fsReplace(v, w))
		}
	case *silkd.FsWatch:
		if watcher {
			return s.fsWatch(v, w)
		}
	case *silkd.GitClone, *silkd.GitStatus, *silkd.GitAdd, *silkd.GitCommit, *silkd.GitPush, *silkd.GitPull, *silkd.GitBranch:
		if s.Git {
			return answer(s.gitOp(req))
		}
	case *silkd.LspStart:
		if s.LSPDir != "" && s.Procs != nil {
			return answer(s.lspStart(v))
		}
	case *silkd.LspRequest:
		if s.LSPDir != "" && s.Procs != nil {
			return s.lspRequest(v, w)
		}
	case *silkd.LspStop:
		if s.LSPDir != "" && s.Procs != nil {
			return answer(s.lspStop(v))
		}
	}
	return nil
}
