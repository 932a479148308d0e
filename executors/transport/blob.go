// Package transport moves a checkpoint between the nodes of a fleet (issue
// 24): the blob format, its writer (the node holding the checkpoint, behind
// GET /v1/checkpoints/{id}/blob) and the import recipe of the node asked to
// claim it (fsm.FetchCheckpoint, which every driver delegates here).
//
// A blob is a tar stream of one checkpoint's store dir, flat, regular files
// only: first HeadName (JSON Head: the checkpoint's record at its origin,
// the origin's snapshot format, each file's name and size), then each file
// in Head.Files order, then SumsName (JSON Sums: each file's SHA-256,
// computed while it was streamed, so the origin reads every file once).
// The receiver takes nothing it was not told to expect: every entry must be
// the next one the head announced, a regular file of the announced size,
// its name a plain file name (no path, no "..", no leading dot); the head
// is bounded, the total is capped (Config.MaxBytes), the format must be the
// receiver's, the digests must match, and nothing may follow SumsName.
//
// The import is the store's atomic staging path every snapshot takes: the
// files are written into a temp dir inside the store (holes kept sparse),
// each fsynced, verified, then the import's marker (MarkerName: its op and
// head) written, the dir SyncTree'd, renamed into the checkpoint's final
// dir and SyncTree'd again. A re-run after a crash finds the op's marker
// under the final name and only syncs it again; a crash before the rename
// leaves a temp dir the driver's start-up sweep removes; a failure before
// the rename removes the temp dir, one of the final sync the renamed dir
// (no record owns it yet, and the checkpoint store is not swept). Nothing
// half-fetched is ever under a checkpoint's name.
package transport

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// Entry names of a blob and the import's marker in the store dir.
const (
	HeadName   = "sbxlog-checkpoint.json"
	SumsName   = "sbxlog-checkpoint.sha256.json"
	MarkerName = ".sbxlog-import.json"
	// Version is the blob format's version (Head.Version).
	Version = 1
	// maxHead bounds the head's and the sums' JSON.
	maxHead = 1 << 20
	// maxFiles bounds the files of one checkpoint.
	maxFiles = 64
)

// Head is a blob's first entry: the checkpoint as its origin records it.
type Head struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	// Format is the origin's snapshot format (FormatOf its hypervisor): a
	// node imports only its own.
	Format    string        `json:"format"`
	Key       event.PoolKey `json:"key"`
	Name      string        `json:"name,omitempty"`
	Tenant    string        `json:"tenant,omitempty"`
	SandboxID string        `json:"sandbox_id,omitempty"`
	CreatedNS int64         `json:"created_ns"`
	ExpiresNS int64         `json:"expires_ns,omitempty"`
	Files     []File        `json:"files"`
}

// File is one file of a checkpoint's dir.
type File struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// Sums is a blob's last entry: each file's SHA-256 (hex), by name.
type Sums struct {
	SHA256 map[string]string `json:"sha256"`
}

// FormatOf is the snapshot format of a node running hypervisor name:
// Cloud Hypervisor and chsim write the same snapshots.
func FormatOf(hypervisor string) string {
	switch hypervisor {
	case "cloud-hypervisor", "chsim":
		return "cloud-hypervisor"
	}
	return hypervisor
}

// ErrNoCheckpoint: the checkpoint's dir is not in the store.
var ErrNoCheckpoint = errors.New("transport: checkpoint dir not in the store")

// Blob is a checkpoint's dir opened for streaming. Its files are open from
// Open on, so a delete of the checkpoint while it streams (the dir renamed
// away and removed) does not cut the stream.
type Blob struct {
	head  Head
	files []*os.File
}

// Open opens the checkpoint dir dir (already resolved within the store)
// for head's checkpoint; head.Files is filled in. A missing dir is
// ErrNoCheckpoint. Entries whose names start with "." (the import's
// marker, temp files) are not part of a checkpoint; anything that is not a
// regular file is refused.
func Open(dir string, head Head) (*Blob, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoCheckpoint
	}
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	b := &Blob{head: head}
	b.head.Version, b.head.Files = Version, nil
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if !e.Type().IsRegular() {
			b.Close()
			return nil, fmt.Errorf("transport: %s in %s is not a regular file", e.Name(), dir)
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			b.Close()
			if errors.Is(err, fs.ErrNotExist) {
				return nil, ErrNoCheckpoint
			}
			return nil, fmt.Errorf("transport: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			b.Close()
			return nil, fmt.Errorf("transport: %w", err)
		}
		b.files = append(b.files, f)
		b.head.Files = append(b.head.Files, File{Name: e.Name(), Size: st.Size()})
	}
	return b, nil
}

// Head is what the blob's head entry says.
func (b *Blob) Head() Head { return b.head }

// Close closes the blob's files.
func (b *Blob) Close() {
	for _, f := range b.files {
		f.Close()
	}
	b.files = nil
}

// WriteTo streams the blob to w: head, files, sums.
func (b *Blob) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	tw := tar.NewWriter(cw)
	now := time.Unix(0, b.head.CreatedNS)
	head, err := json.Marshal(b.head)
	if err != nil {
		return cw.n, err
	}
	if err := writeEntry(tw, HeadName, head, now); err != nil {
		return cw.n, err
	}
	sums := Sums{SHA256: make(map[string]string, len(b.files))}
	for i, f := range b.files {
		fi := b.head.Files[i]
		if err := tw.WriteHeader(entryHeader(fi.Name, fi.Size, now)); err != nil {
			return cw.n, err
		}
		h := sha256.New()
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return cw.n, err
		}
		n, err := io.Copy(io.MultiWriter(tw, h), io.LimitReader(f, fi.Size))
		if err != nil {
			return cw.n, err
		}
		if n != fi.Size {
			return cw.n, fmt.Errorf("transport: %s: %d of %d bytes (it shrank while streamed)", fi.Name, n, fi.Size)
		}
		sums.SHA256[fi.Name] = hex.EncodeToString(h.Sum(nil))
	}
	sb, err := json.Marshal(sums)
	if err != nil {
		return cw.n, err
	}
	if err := writeEntry(tw, SumsName, sb, now); err != nil {
		return cw.n, err
	}
	return cw.n, tw.Close()
}

// entryHeader is the header of every entry of a blob: a regular file.
func entryHeader(name string, size int64, mtime time.Time) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX}
}

func writeEntry(tw *tar.Writer, name string, data []byte, mtime time.Time) error {
	if err := tw.WriteHeader(entryHeader(name, int64(len(data)), mtime)); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// validName reports whether name may name a file of a checkpoint: a plain
// file name, not hidden (the marker's and temp files' names are).
func validName(name string) bool {
	return name != "" && len(name) <= 255 && !strings.ContainsAny(name, "/\\\x00") &&
		!strings.HasPrefix(name, ".") && name != HeadName && name != SumsName
}

// checkHead validates a received head against what the receiver expects.
func checkHead(h *Head, id, format string, maxBytes int64) error {
	if h.Version != Version {
		return fmt.Errorf("blob format version %d, this node reads %d", h.Version, Version)
	}
	if h.ID != id {
		return fmt.Errorf("blob of checkpoint %q, asked for %s", h.ID, id)
	}
	if h.Format != format {
		return fmt.Errorf("checkpoint %s is a %s snapshot; this node runs %s", id, h.Format, format)
	}
	if len(h.Files) == 0 || len(h.Files) > maxFiles {
		return fmt.Errorf("checkpoint %s: %d files, want 1 to %d", id, len(h.Files), maxFiles)
	}
	var total int64
	seen := map[string]bool{}
	for _, f := range h.Files {
		if !validName(f.Name) {
			return fmt.Errorf("checkpoint %s: unsafe file name %q", id, f.Name)
		}
		if seen[f.Name] {
			return fmt.Errorf("checkpoint %s: file %q twice", id, f.Name)
		}
		seen[f.Name] = true
		if f.Size < 0 || f.Size > maxBytes-total {
			return fmt.Errorf("checkpoint %s: over the import cap of %d bytes", id, maxBytes)
		}
		total += f.Size
	}
	if !slices.IsSortedFunc(h.Files, func(a, b File) int { return strings.Compare(a.Name, b.Name) }) {
		return fmt.Errorf("checkpoint %s: files not in name order", id)
	}
	return nil
}
