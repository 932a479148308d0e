package fsx_test

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/fsx/xfstest"
)

// fragment reflinks a dense image and scatters 4 KiB writes over the
// clone: every write breaks a shared extent (copy on write), as a guest's
// writes between hibernates do.
func fragment(t *testing.T, dir string, writes int) string {
	t.Helper()
	base := filepath.Join(dir, "base.raw")
	data := make([]byte, 32<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(base, data, 0o600); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "cow.raw")
	if _, err := fsx.NewCloner(zerolog.Nop()).Clone(disk, base); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	page := make([]byte, 4096)
	for range writes {
		page[0]++
		if _, err := f.WriteAt(page, int64(r.IntN(len(data)/4096))*4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return disk
}

// On XFS with reflink, a fragmented image past the bound is rewritten
// densely (few extents, same content, no temp file left); one within the
// bound is left alone.
func TestRewriteDense(t *testing.T) {
	mnt := xfstest.Mount(t, 512<<20)
	disk := fragment(t, mnt, 300)
	sum, err := fsx.ContentSum(disk)
	if err != nil {
		t.Fatal(err)
	}
	res, err := fsx.RewriteDense(disk, 10_000)
	if err != nil || res.Rewritten || res.Before < 300 {
		t.Fatalf("within the bound: %+v, %v", res, err)
	}
	res, err = fsx.RewriteDense(disk, 100)
	if err != nil || !res.Rewritten || res.After >= 16 || res.After >= res.Before {
		t.Fatalf("past the bound: %+v, %v", res, err)
	}
	if got, _ := fsx.ContentSum(disk); got != sum {
		t.Fatal("content changed by the rewrite")
	}
	ents, _ := os.ReadDir(mnt)
	for _, e := range ents {
		if e.Name() != "base.raw" && e.Name() != "cow.raw" {
			t.Fatalf("left behind: %s", e.Name())
		}
	}
}
