package transport

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// ErrRefused wraps everything a receiver does not take from a blob;
// ErrStream a stream that broke off (the network's, or its origin's
// failure mid-way). Other errors are the local store's.
var (
	ErrRefused = errors.New("refused")
	ErrStream  = errors.New("blob stream broke off")
)

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// Receive reads the blob of checkpoint id from r into dir (an empty temp
// dir inside the store) and returns its head once every file is written,
// fsynced and verified against the blob's digests. format is this node's
// snapshot format; maxBytes caps the files' total. Anything the blob did
// not announce, or announced wrongly, is an error wrapping ErrRefused; the
// caller removes dir on any error.
func Receive(r io.Reader, dir, id, format string, maxBytes int64) (Head, error) {
	tr := tar.NewReader(r)
	var head Head
	if err := readJSON(tr, HeadName, &head); err != nil {
		return head, err
	}
	if err := checkHead(&head, id, format, maxBytes); err != nil {
		return head, refused("%v", err)
	}
	got := make(map[string]string, len(head.Files))
	for _, f := range head.Files {
		hdr, err := next(tr, f.Name)
		if err != nil {
			return head, err
		}
		if hdr.Size != f.Size {
			return head, refused("entry %s: %d bytes, the head says %d", f.Name, hdr.Size, f.Size)
		}
		sum, err := writeFile(filepath.Join(dir, f.Name), tr, f.Size)
		if err != nil {
			return head, err
		}
		got[f.Name] = sum
	}
	var sums Sums
	if err := readJSON(tr, SumsName, &sums); err != nil {
		return head, err
	}
	for _, f := range head.Files {
		if want := sums.SHA256[f.Name]; want != got[f.Name] {
			return head, refused("%s: sha256 %s, the origin sent %q", f.Name, got[f.Name], want)
		}
	}
	if len(sums.SHA256) != len(head.Files) {
		return head, refused("digests of %d files, the head names %d", len(sums.SHA256), len(head.Files))
	}
	if _, err := tr.Next(); err != io.EOF {
		if err == nil {
			return head, refused("an entry after %s", SumsName)
		}
		return head, streamErr(err)
	}
	return head, nil
}

// next reads the next entry, which must be the regular file name.
func next(tr *tar.Reader, name string) (*tar.Header, error) {
	hdr, err := tr.Next()
	if err == io.EOF {
		return nil, refused("blob ends before %s", name)
	}
	if err != nil {
		return nil, streamErr(err)
	}
	if hdr.Name != name {
		return nil, refused("entry %q where %s was announced", hdr.Name, name)
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil, refused("entry %s is not a regular file (type %q)", name, hdr.Typeflag)
	}
	return hdr, nil
}

// streamErr is a broken stream: the tar's own errors are the origin's
// (refused), the transport's are the network's.
func streamErr(err error) error {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, tar.ErrFieldTooLong) || errors.Is(err, tar.ErrInsecurePath) {
		return refused("%v", err)
	}
	return fmt.Errorf("%w: %w", ErrStream, err)
}

func readJSON(tr *tar.Reader, name string, v any) error {
	hdr, err := next(tr, name)
	if err != nil {
		return err
	}
	if hdr.Size > maxHead {
		return refused("%s: %d bytes, over %d", name, hdr.Size, maxHead)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		return streamErr(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return refused("%s: %v", name, err)
	}
	return nil
}

// sparseChunk is the unit writeFile checks for zeros: an all-zero chunk is
// skipped (a hole), as a snapshot's memory and disk are mostly sparse.
const sparseChunk = 64 << 10

// zeroChunk is what copySparse compares each chunk with: bytes.Equal runs
// the runtime's vectorised compare, where a byte loop would cost a branch
// per byte of every checkpoint received (fsx's page scan does the same).
var zeroChunk [sparseChunk]byte

// writeFile writes size bytes of r to the new file path (never an existing
// one, never through a symlink), keeping zero chunks as holes, fsyncs it
// and returns the SHA-256 of what it read.
func writeFile(path string, r io.Reader, size int64) (string, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return "", fmt.Errorf("transport: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if err := copySparse(f, io.TeeReader(io.LimitReader(r, size), h), size); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("transport: fsync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("transport: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copySparse(f *os.File, r io.Reader, size int64) error {
	buf := make([]byte, sparseChunk)
	var off int64
	for off < size {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		if err != nil {
			if err == io.ErrUnexpectedEOF || err == io.EOF {
				return fmt.Errorf("%w: it ends %d bytes into a %d byte file", ErrStream, off+int64(n), size)
			}
			return streamErr(err)
		}
		if !bytes.Equal(buf[:n], zeroChunk[:n]) {
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				return fmt.Errorf("transport: %w", err)
			}
		}
		off += int64(n)
	}
	// The length, holes at the end included.
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("transport: %w", err)
	}
	return nil
}
