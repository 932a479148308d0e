package fsx

import (
	"os"
	"path/filepath"
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
