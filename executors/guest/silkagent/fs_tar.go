package silkagent

import (
	"archive/tar"
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// maxLinkHops bounds the symlinks one resolution follows (as the kernel's
// ELOOP does): a longer chain, or a loop, is refused.
const maxLinkHops = 40

// Errors of an upload stream that ended wrong.
var (
	errNoDataEnd = errors.New("stream ended before data_end")
	errStrayOp   = errors.New("expected data or data_end")
)

// fsPush runs fs_push: the tar stream of the data frames that follow is
// extracted (ExtractInto) from a goroutine fed through a pipe, so a slow
// disk holds the client back, and merged into dest once the stream ended
// with data_end. A refusal is answered at once and the rest of the upload
// is dropped; dest is untouched by a failed push.
func (s *Server) fsPush(req *silkd.FsPush, w *silkd.Writer) *call {
	if req.Dest == "" {
		_ = w.WriteResponse(badRequest("fs_push: dest must not be empty"))
		return finished()
	}
	pr, pw := io.Pipe()
	c := &call{done: make(chan struct{})}
	c.feed = func(in silkd.Request) {
		switch v := in.(type) {
		case *silkd.Data:
			_, _ = pw.Write(v.Data) // a refused push has closed the pipe: dropped
		case *silkd.DataEnd:
			_ = pw.Close()
		default:
			_ = pw.CloseWithError(fmt.Errorf("%w, got %s", errStrayOp, in.Op()))
		}
	}
	// After data_end this changes nothing: a pipe keeps its first close.
	c.endFn = func() { _ = pw.CloseWithError(errNoDataEnd) }
	go func() {
		defer c.finish()
		err := ExtractInto(s.tree(), req.Dest, pr, s.Limits)
		_ = pr.CloseWithError(io.ErrClosedPipe)
		if err != nil {
			if errors.Is(err, errNoDataEnd) || errors.Is(err, errStrayOp) {
				err = badRequest("fs_push: %v", err)
			}
			_ = w.WriteResponse(errFrame(silkd.OpFsPush, err))
			return
		}
		_ = w.WriteResponse(silkd.Done{})
	}()
	return c
}

// ExtractInto extracts the tar stream r into dest (created if need be) as
// fs_push does: into a staging directory inside dest (ExtractTar's rules),
// then, once r has ended, merged into dest with tar's overlay semantics.
// A failure leaves dest as it was.
func ExtractInto(t TreeFS, dest string, r io.Reader, limits Limits) error {
	if err := t.Mkdir(dest, true); err != nil {
		return err
	}
	staging := path.Join(dest, ".sbx-push-"+randomSuffix())
	if err := t.Mkdir(staging, false); err != nil {
		return err
	}
	defer t.Remove(staging, true)
	if err := ExtractTar(t, staging, r, limits); err != nil {
		return err
	}
	// The archive's end marker may come before the end of the stream.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	return mergeTree(t, staging, dest)
}

func randomSuffix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ExtractTar extracts the tar stream r under root, which must be an empty
// directory only the caller writes to, within limits' TarBytes and
// TarEntries. It refuses (bad_request) an entry whose name is absolute or
// has a ".." component, an entry below a symlink of the archive, and a
// symlink or hard link whose target lies outside root, directly or through
// the archive's other symlinks. Directories are created 0755; files get the
// archive's permission bits; devices and fifos are skipped. A later entry
// replaces an earlier one of the same name, as tar does. On error root may
// hold part of the archive.
func ExtractTar(t TreeFS, root string, r io.Reader, limits Limits) error {
	limits = limits.withDefaults()
	zr := &zeroTail{r: r}
	tr := tar.NewReader(zr)
	links := map[string]string{} // the archive's symlinks: name -> target
	var entries int
	var bytes int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// archive/tar takes a stream cut at a block boundary for the
			// end; a whole archive ends with two zero blocks.
			if zr.zeros < 2*blockSize {
				return badRequest("fs_push: not a valid tar stream: it ends without the end-of-archive blocks")
			}
			break
		}
		if err != nil {
			return tarError(err)
		}
		entries++
		if entries > limits.TarEntries {
			return errLimit(silkd.OpFsPush, "the archive has more than %d entries", limits.TarEntries)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "" {
			continue // the root itself ("./")
		}
		if l := underLink(links, name); l != "" {
			return badRequest("fs_push: entry %q lies below the archive's symlink %q", hdr.Name, l)
		}
		full := path.Join(root, name)
		if hdr.Typeflag != tar.TypeDir {
			if err := t.Mkdir(path.Dir(full), true); err != nil {
				return err
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if st, err := t.Lstat(full); err == nil && st.Kind != silkd.FileDir {
				if err := t.Remove(full, false); err != nil {
					return err
				}
				delete(links, name)
			}
			if err := t.Mkdir(full, true); err != nil {
				return err
			}
		case tar.TypeReg, tar.TypeRegA:
			bytes += hdr.Size
			if bytes > limits.TarBytes {
				return errLimit(silkd.OpFsPush, "the archive holds more than %d bytes of files", limits.TarBytes)
			}
			if err := replaceable(t, full, name, links); err != nil {
				return err
			}
			if err := t.WriteNew(full, uint32(hdr.Mode)&0o7777, tr); err != nil {
				return tarError(err)
			}
		case tar.TypeSymlink:
			if !inside(path.Join(path.Dir(name), hdr.Linkname)) || path.IsAbs(hdr.Linkname) {
				return badRequest("fs_push: symlink %q -> %q leaves the destination", hdr.Name, hdr.Linkname)
			}
			if err := replaceable(t, full, name, links); err != nil {
				return err
			}
			if err := t.Symlink(hdr.Linkname, full); err != nil {
				return err
			}
			links[name] = hdr.Linkname
		case tar.TypeLink:
			target, err := entryName(hdr.Linkname)
			if err != nil || target == "" || underLink(links, target) != "" || links[target] != "" {
				return badRequest("fs_push: hard link %q -> %q does not name a file of the archive", hdr.Name, hdr.Linkname)
			}
			if err := copyWithin(t, path.Join(root, target), full, name, links, &bytes, limits); err != nil {
				return err
			}
		default:
			// Devices, fifos and the like: nothing a project needs.
		}
	}
	for name := range links {
		if !linkStaysInside(links, name) {
			return badRequest("fs_push: symlink %q -> %q leaves the destination", name, links[name])
		}
	}
	return nil
}

// blockSize is tar's block.
const blockSize = 512

// zeroTail counts the zero bytes at the end of what was read through it.
type zeroTail struct {
	r     io.Reader
	zeros int
}

func (z *zeroTail) Read(p []byte) (int, error) {
	n, err := z.r.Read(p)
	for _, b := range p[:n] {
		if b == 0 {
			z.zeros++
		} else {
			z.zeros = 0
		}
	}
	return n, err
}

// tarError classifies an error reading the archive: a malformed or cut
// stream is the client's.
func tarError(err error) error {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrFieldTooLong) {
		return badRequest("fs_push: not a valid tar stream: %v", err)
	}
	return err
}

// entryName checks an archive name and returns it cleaned and relative
// ("" for the root itself).
func entryName(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") {
		return "", badRequest("fs_push: entry %q: absolute or empty names are refused", name)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", badRequest("fs_push: entry %q: names with \"..\" are refused", name)
		}
	}
	n := path.Clean(name)
	if n == "." {
		return "", nil
	}
	return n, nil
}

// underLink returns the archive symlink that name lies below, or "".
func underLink(links map[string]string, name string) string {
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if _, ok := links[d]; ok {
			return d
		}
	}
	return ""
}

// inside reports whether the cleaned relative path p stays within the root.
func inside(p string) bool {
	p = path.Clean(p)
	return p != ".." && !strings.HasPrefix(p, "../")
}

// replaceable clears the way for a non-directory entry at full: an earlier
// file or symlink of that name goes; a directory stays (and the entry fails).
func replaceable(t TreeFS, full, name string, links map[string]string) error {
	st, err := t.Lstat(full)
	if err != nil {
		return nil
	}
	if st.Kind == silkd.FileDir {
		return badRequest("fs_push: entry %q: a directory of that name came first", name)
	}
	delete(links, name)
	return t.Remove(full, false)
}

// copyWithin extracts a hard link as a copy of an earlier file of the
// archive (TreeFS has no link call, and a copy cannot be used to reach
// outside the root).
func copyWithin(t TreeFS, from, full, name string, links map[string]string, bytes *int64, limits Limits) error {
	st, err := t.Lstat(from)
	if err != nil || st.Kind != silkd.FileRegular {
		return badRequest("fs_push: hard link %q: its target is not a file of the archive", name)
	}
	*bytes += int64(st.Size)
	if *bytes > limits.TarBytes {
		return errLimit(silkd.OpFsPush, "the archive holds more than %d bytes of files", limits.TarBytes)
	}
	src, err := t.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := replaceable(t, full, name, links); err != nil {
		return err
	}
	return t.WriteNew(full, st.Mode, src)
}

// linkStaysInside resolves the archive's symlink name through the
// archive's symlinks (the only ones in the staging tree) and reports
// whether it stays within the root: each link passed the lexical check
// alone, but a chain (a -> b/.., b -> ..) can still climb out.
func linkStaysInside(links map[string]string, name string) bool {
	var cur []string
	todo := append(strings.Split(path.Dir(name), "/"), strings.Split(links[name], "/")...)
	hops := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return false
			}
			cur = cur[:len(cur)-1]
			continue
		}
		p := path.Join(append(append([]string{}, cur...), c)...)
		if target, ok := links[p]; ok {
			hops++
			if hops > maxLinkHops || path.IsAbs(target) {
				return false
			}
			todo = append(strings.Split(target, "/"), todo...)
			continue
		}
		cur = append(cur, c)
	}
	return true
}

// mergeTree moves src's entries into dst with tar's overlay semantics:
// directories merge, a file or symlink replaces one of the same name (an
// atomic rename), a directory replaces a file; a file where dst has a
// directory is refused.
func mergeTree(t TreeFS, src, dst string) error {
	es, err := t.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range es {
		from, to := path.Join(src, e.Name), path.Join(dst, e.Name)
		st, err := t.Lstat(to)
		switch {
		case err != nil && errors.Is(err, fs.ErrNotExist):
			err = t.Rename(from, to)
		case err != nil:
		case e.Kind == silkd.FileDir && st.Kind == silkd.FileDir:
			err = mergeTree(t, from, to)
		case e.Kind == silkd.FileDir:
			if err = t.Remove(to, false); err == nil {
				err = t.Rename(from, to)
			}
		case st.Kind == silkd.FileDir:
			err = badRequest("fs_push: %s is a directory, the archive has a file there", to)
		default:
			err = t.Rename(from, to)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// fsPull runs fs_pull: a tar of path (named by its base name, as
// `tar -C dir -c base` makes it) streamed as data frames, then done.
func (s *Server) fsPull(req *silkd.FsPull, w *silkd.Writer) error {
	if req.Path == "" {
		return badRequest("fs_pull: path must not be empty")
	}
	p := path.Clean(req.Path)
	if p == "/" || p == "." {
		return badRequest("fs_pull: path %q has no base name to archive under", req.Path)
	}
	bw := bufio.NewWriterSize(silkd.BulkWriter{W: w, Kind: silkd.BulkDataReply}, silkd.BulkChunk)
	if err := WriteTar(s.tree(), p, path.Base(p), bw, s.Limits); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return w.WriteResponse(silkd.Done{})
}

// WriteTar writes a tar of p (regular files, directories, symlinks;
// anything else is left out) to out, within limits' TarBytes and
// TarEntries, p named name: "" archives a directory's contents without it.
// Symlinks are archived, not followed. A file that changes size while it is
// read fails the archive.
func WriteTar(t TreeFS, p, name string, out io.Writer, limits Limits) error {
	limits = limits.withDefaults()
	st, err := t.Lstat(p)
	if err != nil {
		return err
	}
	if name == "" && st.Kind != silkd.FileDir {
		return badRequest("%s is not a directory: only a directory's contents can be archived without its name", p)
	}
	tw := tar.NewWriter(out)
	buf := make([]byte, 64<<10) // one copy buffer for every file, not one each
	var entries int
	var bytes int64
	var walk func(full, name string, st silkd.StatInfo) error
	walk = func(full, name string, st silkd.StatInfo) error {
		entries++
		if entries > limits.TarEntries {
			return errLimit(silkd.OpFsPull, "%s has more than %d entries", p, limits.TarEntries)
		}
		hdr := &tar.Header{Name: name, Mode: int64(st.Mode), ModTime: time.Unix(int64(st.MtimeEpochSecs), 0)}
		switch st.Kind {
		case silkd.FileDir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
			if name == "" {
				hdr = nil // the contents of the top directory only
			}
		case silkd.FileSymlink:
			target, err := t.Readlink(full)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case silkd.FileRegular:
			bytes += int64(st.Size)
			if bytes > limits.TarBytes {
				return errLimit(silkd.OpFsPull, "%s holds more than %d bytes of files", p, limits.TarBytes)
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(st.Size)
		default:
			return nil
		}
		if hdr != nil {
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		}
		switch st.Kind {
		case silkd.FileRegular:
			f, err := t.Open(full)
			if err != nil {
				return err
			}
			n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size+1), buf)
			f.Close()
			if err == nil && n != hdr.Size {
				err = fmt.Errorf("%s changed size while it was archived", full)
			}
			if err != nil {
				return err
			}
		case silkd.FileDir:
			es, err := t.ReadDir(full)
			if err != nil {
				return err
			}
			sort.Slice(es, func(i, j int) bool { return es[i].Name < es[j].Name })
			for _, e := range es {
				child := path.Join(full, e.Name)
				cst, err := t.Lstat(child)
				if errors.Is(err, fs.ErrNotExist) {
					continue // removed while the archive was made
				}
				if err != nil {
					return err
				}
				if err := walk(child, path.Join(name, e.Name), cst); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(p, name, st); err != nil {
		return err
	}
	return tw.Close()
}
