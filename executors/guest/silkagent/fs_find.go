package silkagent

import (
	"bytes"
	"errors"
	"io"
	"path"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// fsFind runs fs_find: a match frame for every line (1-based) of every
// regular file under the path (symlinks are not followed) whose name
// matches glob and whose content matches pattern, then done. Files over
// FindFileBytes, and files that are not UTF-8 text, are skipped unread or
// unmatched, as the old agent did; a directory below the root that cannot
// be read is skipped. Past FindMatches the find ends with a bad_request.
func (s *Server) fsFind(req *silkd.FsFind, w *silkd.Writer) error {
	if req.Path == "" {
		return badRequest("fs_find: path must not be empty")
	}
	re, err := regexp.Compile(req.Pattern)
	if err != nil {
		return badRequest("fs_find: pattern: %v", err)
	}
	var name *regexp.Regexp
	if req.Glob != "" {
		if name, err = globRegexp(req.Glob); err != nil {
			return badRequest("fs_find: glob: %v", err)
		}
	}
	t := s.tree()
	limits := s.Limits.withDefaults()
	root := path.Clean(req.Path)
	if _, err := t.ReadDir(root); err != nil {
		return err
	}
	matches := 0
	stack := []string{root}
	for len(stack) > 0 {
		dir := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		es, err := t.ReadDir(dir)
		if err != nil {
			continue
		}
		// Pushed in reverse, so the walk visits names in order.
		for i := len(es) - 1; i >= 0; i-- {
			if es[i].Kind == silkd.FileDir {
				stack = append(stack, path.Join(dir, es[i].Name))
			}
		}
		for _, e := range es {
			if e.Kind != silkd.FileRegular || e.Size > uint64(limits.FindFileBytes) || (name != nil && !name.MatchString(e.Name)) {
				continue
			}
			file := path.Join(dir, e.Name)
			body, ok := readText(t, file, limits.FindFileBytes)
			if !ok {
				continue
			}
			for i, line := range lines(body) {
				if !re.MatchString(line) {
					continue
				}
				matches++
				if matches > limits.FindMatches {
					return errLimit(silkd.OpFsFind, "more than %d matches; narrow the pattern, the path or the glob", limits.FindMatches)
				}
				err := w.WriteResponse(silkd.Match{File: file, Line: uint64(i + 1), Content: line})
				if errors.Is(err, silkd.ErrFrameTooLarge) {
					return silkd.Errorf(silkd.KindInternal, "fs_find: the match at %s:%d exceeds the frame cap", file, i+1)
				}
				if err != nil {
					return err // the client is gone
				}
			}
		}
	}
	return w.WriteResponse(silkd.Done{})
}

// readText reads a file of at most limit bytes that is UTF-8 text.
func readText(t TreeFS, file string, limit int64) (string, bool) {
	f, err := t.Open(file)
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil || int64(len(b)) > limit || !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// lines splits s into lines as Rust's str::lines does: "\n" or "\r\n"
// ends a line, and a final line terminator adds no empty line.
func lines(s string) []string {
	out := strings.Split(s, "\n")
	if len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	for i, l := range out {
		out[i] = strings.TrimSuffix(l, "\r")
	}
	return out
}

// globRegexp compiles a glob of * and ? into a regexp over a whole name.
func globRegexp(glob string) (*regexp.Regexp, error) {
	q := regexp.QuoteMeta(glob)
	q = strings.ReplaceAll(q, `\*`, ".*")
	q = strings.ReplaceAll(q, `\?`, ".")
	return regexp.Compile("^" + q + "$")
}

// fsReplace runs fs_replace: in each file in order, every match of pattern
// is replaced (Go's regexp expansion: $1, ${name}); a file with matches is
// rewritten atomically, keeping its mode. One replaced frame a file, then
// done; a file over FindFileBytes is left alone (0 replacements). The
// first file that cannot be read or written ends the RPC with its error,
// the files before it having been rewritten (per file, not per list).
func (s *Server) fsReplace(req *silkd.FsReplace, w *silkd.Writer) error {
	re, err := regexp.Compile(req.Pattern)
	if err != nil {
		return badRequest("fs_replace: pattern: %v", err)
	}
	t := s.tree()
	limits := s.Limits.withDefaults()
	for _, file := range req.Files {
		if file == "" {
			return badRequest("fs_replace: a file path must not be empty")
		}
		st, err := t.Stat(file)
		if err != nil {
			return err
		}
		var n uint64
		if st.Size <= uint64(limits.FindFileBytes) {
			if n, err = replaceIn(t, re, file, req.Replacement, limits.FindFileBytes); err != nil {
				return err
			}
		}
		if err := w.WriteResponse(silkd.Replaced{File: file, Replacements: n}); err != nil {
			return err
		}
	}
	return w.WriteResponse(silkd.Done{})
}

// replaceIn rewrites one file and returns its replacement count.
func replaceIn(t TreeFS, re *regexp.Regexp, file, repl string, limit int64) (uint64, error) {
	f, err := t.Open(file)
	if err != nil {
		return 0, err
	}
	body, err := io.ReadAll(io.LimitReader(f, limit+1))
	f.Close()
	if err != nil {
		return 0, err
	}
	if int64(len(body)) > limit {
		return 0, nil // grew past the bound since the stat
	}
	if !utf8.Valid(body) {
		return 0, silkd.Errorf(silkd.KindInternal, "fs_replace: read %s: stream did not contain valid UTF-8", file)
	}
	n := uint64(len(re.FindAllIndex(body, -1)))
	if n == 0 {
		return 0, nil
	}
	out := re.ReplaceAll(body, []byte(repl))
	up, err := t.Create(file, nil)
	if err != nil {
		return 0, err
	}
	if _, err := io.Copy(up, bytes.NewReader(out)); err != nil {
		up.Abort()
		return 0, err
	}
	return n, up.Commit()
}
