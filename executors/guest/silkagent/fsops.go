package silkagent

import (
	"io"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// FS is the file tree the fs_* ops act on. Paths are as the client sent
// them (non-empty; the Server checks). Errors wrapping fs.ErrNotExist become
// not_found, an *silkd.Error is sent as it is, anything else is internal.
type FS interface {
	// Stat describes path, following symlinks.
	Stat(path string) (silkd.StatInfo, error)
	// ReadDir lists path without following symlinks.
	ReadDir(path string) ([]silkd.Entry, error)
	// Open opens a regular file for reading; anything else is a
	// bad_request *silkd.Error.
	Open(path string) (io.ReadCloser, error)
	// Create starts an atomic replacement of path: nothing is visible
	// under path until Commit. mode nil means the replaced file's mode, or
	// 0644 for a new file.
	Create(path string, mode *uint32) (Upload, error)
	Mkdir(path string, parents bool) error
	Remove(path string, recursive bool) error
	Rename(from, to string) error
}

// Upload is a file being written by fs_write.
type Upload interface {
	io.Writer
	// Commit puts the file in place.
	Commit() error
	// Abort drops it.
	Abort()
}

// fsOp runs the fs ops that take no input, on the reader goroutine.
func (s *Server) fsOp(req silkd.Request, w *silkd.Writer) {
	op := req.Op()
	fail := func(err error) { _ = w.WriteResponse(errFrame(op, err)) }
	var paths []string
	switch v := req.(type) {
	case *silkd.FsRead:
		paths = []string{v.Path}
	case *silkd.FsList:
		paths = []string{v.Path}
	case *silkd.FsStat:
		paths = []string{v.Path}
	case *silkd.FsMkdir:
		paths = []string{v.Path}
	case *silkd.FsRm:
		paths = []string{v.Path}
	case *silkd.FsRename:
		paths = []string{v.From, v.To}
	}
	for _, p := range paths {
		if p == "" {
			_ = w.WriteResponse(badRequest("%s: path must not be empty", op))
			return
		}
	}
	var err error
	switch v := req.(type) {
	case *silkd.FsStat:
		var st silkd.StatInfo
		if st, err = s.FS.Stat(v.Path); err == nil {
			_ = w.WriteResponse(silkd.Stat{Info: st})
			return
		}
	case *silkd.FsList:
		var es []silkd.Entry
		if es, err = s.FS.ReadDir(v.Path); err == nil {
			for len(es) > 0 {
				n := min(len(es), silkd.EntriesBatch)
				if werr := w.WriteResponse(silkd.Entries{Entries: es[:n]}); werr != nil {
					return
				}
				es = es[n:]
			}
		}
	case *silkd.FsRead:
		err = s.fsRead(v.Path, w)
	case *silkd.FsMkdir:
		err = s.FS.Mkdir(v.Path, v.Parents)
	case *silkd.FsRm:
		err = s.FS.Remove(v.Path, v.Recursive)
	case *silkd.FsRename:
		err = s.FS.Rename(v.From, v.To)
	}
	if err != nil {
		fail(err)
		return
	}
	_ = w.WriteResponse(silkd.Done{})
}

func (s *Server) fsRead(path string, w *silkd.Writer) error {
	f, err := s.FS.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, silkd.BulkChunk)
	for {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			if werr := w.WriteBulk(silkd.BulkDataReply, buf[:n]); werr != nil {
				return werr // the client is gone; the error frame fails too
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// fsWrite runs fs_write: the upload is written from the input frames, on
// the reader goroutine, and answered at data_end (or at once on a refusal).
func (s *Server) fsWrite(req *silkd.FsWrite, w *silkd.Writer) *call {
	if req.Path == "" {
		_ = w.WriteResponse(badRequest("fs_write: path must not be empty"))
		return finished()
	}
	up, err := s.FS.Create(req.Path, req.Mode)
	if err != nil {
		_ = w.WriteResponse(errFrame(silkd.OpFsWrite, err))
		return finished()
	}
	c := &call{done: make(chan struct{})}
	settled := false
	settle := func(r silkd.Response) {
		if settled {
			return
		}
		settled = true
		_ = w.WriteResponse(r)
		c.finish()
	}
	c.feed = func(in silkd.Request) {
		if settled {
			return
		}
		switch v := in.(type) {
		case *silkd.Data:
			if _, err := up.Write(v.Data); err != nil {
				up.Abort()
				settle(errFrame(silkd.OpFsWrite, err))
			}
		case *silkd.DataEnd:
			if err := up.Commit(); err != nil {
				settle(errFrame(silkd.OpFsWrite, err))
				return
			}
			settle(silkd.Done{})
		default:
			up.Abort()
			settle(badRequest("fs_write: expected data or data_end, got %s", in.Op()))
		}
	}
	c.endFn = func() {
		if !settled {
			up.Abort()
			settle(badRequest("fs_write: stream ended before data_end"))
		}
	}
	return c
}
