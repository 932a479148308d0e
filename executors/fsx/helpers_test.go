package fsx

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

// region is a range of a test file filled with data; the rest stays a hole.
type region struct{ off, len int64 }

// writeSparse creates path of the given size with pseudo-random data in regions
// (page-aligned in the tests, so SEEK_DATA reports them exactly), fsynced, and
// returns the number of data bytes written.
func writeSparse(t *testing.T, path string, size int64, perm os.FileMode, regions ...region) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	var written int64
	var seed [32]byte
	copy(seed[:], path)
	rng := rand.NewChaCha8(seed)
	for _, r := range regions {
		buf := make([]byte, r.len)
		_, _ = rng.Read(buf) // never fails
		if _, err := f.WriteAt(buf, r.off); err != nil {
			t.Fatal(err)
		}
		written += r.len
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil { // not subject to umask
		t.Fatal(err)
	}
	return written
}

func checksum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// logBuf is a goroutine-safe log sink that counts the lines logged.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuf) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.TrimSpace(l.buf.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func newLogged() (*Cloner, *logBuf) {
	lb := &logBuf{}
	return NewCloner(zerolog.New(lb)), lb
}
