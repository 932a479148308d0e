package fsx

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// TrashName is the name, at the top of the store, a snapshot dir being
// discarded is renamed to: a TempPrefix name (so the start-up SweepTemp
// removes one a crash left) derived from the removal's id, so a re-run of
// the removal finds the one it started.
func TrashName(id string) string { return TempPrefix + "trash-" + strings.ReplaceAll(id, "/", "_") }

// Discard removes dir, a snapshot dir of the store storeDir, crash-safely:
// dir is first renamed to the trash name of id (durably: RenameDir fsyncs
// both parents), so from then on no reader finds a half-removed snapshot
// under its name, then the trash is removed. Idempotent under id: a dir
// already gone is success, and a trash a cut run left is removed.
func Discard(fsys FS, storeDir, dir, id string) error {
	trash := filepath.Join(storeDir, TrashName(id))
	if _, err := os.Lstat(dir); err == nil {
		if err := fsys.RenameDir(dir, trash); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		} else if err != nil {
			// A trash of this id already stands (a cut run): clear it and retry.
			if err := fsys.RemoveAll(trash); err != nil {
				return err
			}
			if err := fsys.RenameDir(dir, trash); err != nil {
				return err
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("fsx: discard: %w", err)
	}
	return fsys.RemoveAll(trash)
}

// digestChunk is the chunk size of ContentDigest's per-file hashes.
const digestChunk = 16 << 20

// ContentDigest is a snapshot dir's content identity ("sha256:" and 64 hex
// digits): SHA-256 over a versioned canonical stream of its regular files
// other than skip (metadata that must not change the identity), in lexical
// order of their slash-relative paths, each as its path, its byte length
// and the SHA-256 of each 16 MiB chunk of its bytes. Modes, times and
// directory entries do not count.
func ContentDigest(dir string, skip ...string) (string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if !slices.Contains(skip, rel) {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("fsx: digest: %w", err)
	}
	slices.Sort(files)
	h := sha256.New()
	h.Write([]byte("sbx-content-v1\n"))
	var num [8]byte
	buf := make([]byte, 1<<20)
	for _, rel := range files {
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return "", fmt.Errorf("fsx: digest: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return "", fmt.Errorf("fsx: digest: %w", err)
		}
		binary.BigEndian.PutUint64(num[:], uint64(len(rel)))
		h.Write(num[:])
		h.Write([]byte(rel))
		binary.BigEndian.PutUint64(num[:], uint64(st.Size()))
		h.Write(num[:])
		for {
			ch := sha256.New()
			n, err := io.CopyBuffer(ch, io.LimitReader(f, digestChunk), buf)
			if err != nil {
				f.Close()
				return "", fmt.Errorf("fsx: digest: %w", err)
			}
			if n == 0 {
				break
			}
			h.Write(ch.Sum(nil))
		}
		f.Close()
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
