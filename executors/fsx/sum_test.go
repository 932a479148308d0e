package fsx

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// ContentSum depends on the bytes only, not on where the holes are.
func TestContentSum(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, size int64, at int64, data []byte, zeroFill bool) string {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if zeroFill {
			if _, err := f.Write(make([]byte, size)); err != nil {
				t.Fatal(err)
			}
		} else if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(data, at); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sum := func(p string) string {
		s, err := ContentSum(p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	data := []byte("guest memory page")
	sparse := sum(write("sparse", 1<<20, 64<<10, data, false))
	dense := sum(write("dense", 1<<20, 64<<10, data, true))
	if sparse != dense {
		t.Fatal("the same bytes with and without holes digest differently")
	}
	for name, other := range map[string]string{
		"other offset": sum(write("moved", 1<<20, 128<<10, data, false)),
		"other size":   sum(write("longer", 2<<20, 64<<10, data, false)),
		"other bytes":  sum(write("changed", 1<<20, 64<<10, []byte("guest memory pagE"), false)),
	} {
		if other == sparse {
			t.Errorf("%s: same digest", name)
		}
	}
}

// layeredFile writes a file of every layout DataRuns walks: a run of
// pages, a written zero page inside the data, a run across the 1 MiB read
// chunk, a hole, and a partial last page.
func layeredFile(t *testing.T) (string, int64) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layered")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 3<<20 + 100
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	fill := func(at int64, n int, b byte) {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = b + byte(i%7)
		}
		if b == 0 {
			clear(buf)
		}
		if _, err := f.WriteAt(buf, at); err != nil {
			t.Fatal(err)
		}
	}
	fill(0, 3*4096, 1)            // pages 0-2
	fill(3*4096, 4096, 0)         // page 3: written zeros
	fill(4*4096, 4096, 2)         // page 4
	fill(1<<20-8192, 16384, 3)    // across the first 1 MiB chunk
	fill(3<<20-4096, 4096+100, 4) // the last full page and the partial one
	return p, size
}

// DataRuns reports exactly the runs of non-zero pages, merged across
// nothing but adjacent non-zero pages (a run may be split at a read chunk),
// and ContentSum keeps the digest archives recorded before it was built on
// DataRuns (their manifests must still verify).
func TestDataRuns(t *testing.T) {
	p, size := layeredFile(t)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type span struct{ off, n int64 }
	var got []span
	if err := DataRuns(f, size, func(off int64, run []byte) error {
		if n := len(got); n > 0 && got[n-1].off+got[n-1].n == off {
			got[n-1].n += int64(len(run)) // a run split at a read chunk
		} else {
			got = append(got, span{off, int64(len(run))})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []span{{0, 3 * 4096}, {4 * 4096, 4096}, {1<<20 - 8192, 16384}, {3<<20 - 4096, 4096 + 100}}
	if !slices.Equal(got, want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	sum, err := ContentSum(p)
	if err != nil {
		t.Fatal(err)
	}
	if sum != pinnedLayeredSum {
		t.Fatalf("ContentSum %s, the digest before DataRuns %s", sum, pinnedLayeredSum)
	}
}

// pinnedLayeredSum is layeredFile's ContentSum by the page loop ContentSum
// had before DataRuns.
const pinnedLayeredSum = "8e0883e2818fc51d307c2b2b6b5bbfe7bec7134d64de2dd0f61f98153ee8fee6"

// DataRuns reads ahead of fn in a goroutine: an error of fn ends the walk
// at once with that error, at every run, and nothing reads f afterwards
// (the file is closed right after; -race sees a read that outlived it).
func TestDataRunsStopsOnError(t *testing.T) {
	p, size := layeredFile(t)
	errStop := errors.New("stop")
	for stopAt := 1; stopAt <= 4; stopAt++ {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		calls := 0
		err = DataRuns(f, size, func(int64, []byte) error {
			calls++
			if calls == stopAt {
				return errStop
			}
			return nil
		})
		f.Close()
		if !errors.Is(err, errStop) || calls != stopAt {
			t.Fatalf("stop at run %d: %v after %d calls", stopAt, err, calls)
		}
	}
	// A file shorter than size ends the walk at its end, without error.
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last int64
	if err := DataRuns(f, size+5<<20, func(off int64, run []byte) error { last = off + int64(len(run)); return nil }); err != nil || last != size {
		t.Fatalf("walk past the end: %v, last byte %d, want %d", err, last, size)
	}
}
