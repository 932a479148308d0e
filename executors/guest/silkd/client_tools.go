package silkd

import (
	"context"
	"io"
)

// Push runs fs_push: the tar stream tarStream is extracted under dest.
func (c *Conn) Push(ctx context.Context, dest string, tarStream io.Reader) error {
	return c.upload(ctx, FsPush{Dest: dest}, dest, tarStream)
}

// Pull runs fs_pull, writing the tar of path to tarStream; it returns the
// bytes written.
func (c *Conn) Pull(ctx context.Context, path string, tarStream io.Writer) (int64, error) {
	return c.download(ctx, FsPull{Path: path}, tarStream)
}

// collect runs req and gathers its frames of type T until done.
func collect[T any](ctx context.Context, c *Conn, req Request) ([]T, error) {
	var out []T
	err := c.stream(ctx, req, func(r Response) error {
		v, ok := any(r).(*T)
		if !ok {
			return unexpected(req.Op(), r)
		}
		out = append(out, *v)
		return nil
	})
	return out, err
}

// Find runs fs_find: the lines under path matching pattern (a regular
// expression), in files whose name matches glob (* and ?) when it is set.
func (c *Conn) Find(ctx context.Context, path, pattern, glob string) ([]Match, error) {
	return collect[Match](ctx, c, FsFind{Path: path, Pattern: pattern, Glob: glob})
}

// Replace runs fs_replace: one result a file.
func (c *Conn) Replace(ctx context.Context, files []string, pattern, replacement string) ([]Replaced, error) {
	return collect[Replaced](ctx, c, FsReplace{Files: files, Pattern: pattern, Replacement: replacement})
}

// Watch runs fs_watch and returns once the watch is armed (ready): every
// change after it is reported. The watch owns the connection; Close ends
// it.
func (c *Conn) Watch(ctx context.Context, path string, recursive bool) (*Watch, error) {
	r, err := c.one(ctx, FsWatch{Path: path, Recursive: recursive})
	if err != nil {
		return nil, err
	}
	if _, ok := r.(*Ready); !ok {
		c.unusable.Store(true)
		return nil, unexpected(OpFsWatch, r)
	}
	c.unusable.Store(true) // the stream owns the connection from now on
	return &Watch{c: c}, nil
}

// Watch is a running fs_watch.
type Watch struct {
	c *Conn
}

// Next returns the next event. The watch's end is an *Error (the agent's
// queue overflowed, or the watch failed) or the connection's error.
func (w *Watch) Next() (Event, error) {
	r, err := w.c.next()
	if err != nil {
		return Event{}, err
	}
	switch v := r.(type) {
	case *Event:
		return *v, nil
	case *Error:
		return Event{}, v
	}
	return Event{}, unexpected(OpFsWatch, r)
}

// Close ends the watch (and the connection).
func (w *Watch) Close() error { return w.c.Close() }

// result runs req and expects one answer of type T.
func result[T any](ctx context.Context, c *Conn, req Request) (*T, error) {
	r, err := c.one(ctx, req)
	if err != nil {
		return nil, err
	}
	v, ok := any(r).(*T)
	if !ok {
		c.unusable.Store(true)
		return nil, unexpected(req.Op(), r)
	}
	return v, nil
}

// GitClone runs git_clone.
func (c *Conn) GitClone(ctx context.Context, req GitClone) error { return c.done(ctx, req) }

// GitStatus runs git_status.
func (c *Conn) GitStatus(ctx context.Context, path string) (*GitStatusResult, error) {
	return result[GitStatusResult](ctx, c, GitStatus{Path: path})
}

// GitAdd runs git_add.
func (c *Conn) GitAdd(ctx context.Context, path string, files []string) error {
	return c.done(ctx, GitAdd{Path: path, Files: files})
}

// GitCommit runs git_commit and returns the new commit's hash.
func (c *Conn) GitCommit(ctx context.Context, path, message, author string) (string, error) {
	r, err := result[GitCommitResult](ctx, c, GitCommit{Path: path, Message: message, Author: author})
	if err != nil {
		return "", err
	}
	return r.Hash, nil
}

// GitPush runs git_push.
func (c *Conn) GitPush(ctx context.Context, path, auth string) error {
	return c.done(ctx, GitPush{Path: path, Auth: auth})
}

// GitPull runs git_pull.
func (c *Conn) GitPull(ctx context.Context, path, auth string) error {
	return c.done(ctx, GitPull{Path: path, Auth: auth})
}

// GitBranches runs git_branch list.
func (c *Conn) GitBranches(ctx context.Context, path string) (*GitBranches, error) {
	return result[GitBranches](ctx, c, GitBranch{Path: path, Action: "list"})
}

// GitBranch runs git_branch create, delete or checkout of name.
func (c *Conn) GitBranch(ctx context.Context, path, action, name string) error {
	return c.done(ctx, GitBranch{Path: path, Action: action, Name: name})
}

// LspStart runs lsp_start and returns the server's id.
func (c *Conn) LspStart(ctx context.Context, language, root string) (string, error) {
	r, err := result[LspStarted](ctx, c, LspStart{Language: language, Root: root})
	if err != nil {
		return "", err
	}
	return r.ServerID, nil
}

// LspRequest runs lsp_request and returns the server's stdio as a stream:
// Write goes to its stdin, CloseWrite closes it, Read returns its stdout
// and io.EOF at its done. The stream owns the connection; its frames are
// bounded by MaxStreamFrame.
func (c *Conn) LspRequest(ctx context.Context, serverID string) (*PortConn, error) {
	return c.openStream(ctx, LspRequest{ServerID: serverID})
}

// LspStop runs lsp_stop.
func (c *Conn) LspStop(ctx context.Context, serverID string) error {
	return c.done(ctx, LspStop{ServerID: serverID})
}
