package silkagent

import (
	"bytes"
	"errors"
	"io/fs"
	"strings"
	"syscall"
	"testing"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// upload writes data to p in one Create, Write and Commit, as fs_write does
// (an error aborts the upload).
func upload(m *MemFS, p string, data []byte) error {
	up, err := m.Create(p, nil)
	if err != nil {
		return err
	}
	if _, err := up.Write(data); err != nil {
		up.Abort()
		return err
	}
	return up.Commit()
}

func isENOSPC(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && errors.Is(err, syscall.ENOSPC)
}

// A MemFS with a Limit answers what would pass it with ENOSPC, counting
// data, paths and NodeOverhead, and gives space back on remove, replace
// and abort.
func TestMemFSLimit(t *testing.T) {
	const limit = 64 << 10
	node := func(p string) int64 { return int64(NodeOverhead + len(p)) }
	for _, tc := range []struct {
		name string
		run  func(m *MemFS) error
		// used is Used() after run, from an empty tree with /d.
		used   func() int64
		enospc bool
	}{
		{"fits", func(m *MemFS) error { return upload(m, "/d/f", make([]byte, 1000)) },
			func() int64 { return node("/d") + node("/d/f") + 1000 }, false},
		{"past the limit", func(m *MemFS) error { return upload(m, "/d/f", make([]byte, limit)) },
			func() int64 { return node("/d") }, true},
		{"exactly the limit", func(m *MemFS) error {
			return upload(m, "/d/f", make([]byte, limit-node("/d")-node("/d/f")))
		}, func() int64 { return limit }, false},
		{"empty files count", func(m *MemFS) error {
			for i := 0; ; i++ {
				if err := upload(m, "/d/"+strings.Repeat("x", i%50)+string(rune('a'+i%26)), nil); err != nil {
					return err
				}
			}
		}, nil, true},
		{"directories count", func(m *MemFS) error {
			// 200 levels: their paths alone pass the limit.
			return m.Mkdir("/d/"+strings.Repeat("deep/", 200), true)
		}, func() int64 { return node("/d") }, true},
		{"replace needs room for both until commit", func(m *MemFS) error {
			half := int64(limit/2) - node("/d") - node("/d/f")
			if err := upload(m, "/d/f", make([]byte, half)); err != nil {
				return err
			}
			return upload(m, "/d/f", make([]byte, half+1000))
		}, func() int64 { return limit / 2 }, true},
		{"remove frees", func(m *MemFS) error {
			if err := upload(m, "/d/f", make([]byte, limit/2)); err != nil {
				return err
			}
			if err := m.Remove("/d/f", false); err != nil {
				return err
			}
			return upload(m, "/d/g", make([]byte, limit/2))
		}, func() int64 { return node("/d") + node("/d/g") + limit/2 }, false},
		{"rename to a longer path", func(m *MemFS) error {
			if err := upload(m, "/d/f", make([]byte, limit-node("/d")-node("/d/f"))); err != nil {
				return err
			}
			return m.Rename("/d/f", "/d/longer")
		}, func() int64 { return limit }, true},
		{"rename to a shorter path", func(m *MemFS) error {
			if err := upload(m, "/d/long", make([]byte, 1000)); err != nil {
				return err
			}
			return m.Rename("/d/long", "/d/s")
		}, func() int64 { return node("/d") + node("/d/s") + 1000 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMemFS(nil)
			m.Limit = limit
			if err := m.Mkdir("/d", false); err != nil {
				t.Fatal(err)
			}
			err := tc.run(m)
			if tc.enospc != isENOSPC(err) || (!tc.enospc && err != nil) {
				t.Fatalf("err = %v, want ENOSPC %v", err, tc.enospc)
			}
			if got := m.Used(); got > limit || (tc.used != nil && got != tc.used()) {
				want := int64(-1)
				if tc.used != nil {
					want = tc.used()
				}
				t.Fatalf("Used = %d, want %d (limit %d)", got, want, limit)
			}
		})
	}
}

// The count survives Files -> NewMemFS (chsim's snapshot), and a tree
// without a Limit takes anything.
func TestMemFSLimitAcrossSnapshot(t *testing.T) {
	m := NewMemFS(nil)
	if err := upload(m, "/big", bytes.Repeat([]byte{1}, 1<<20)); err != nil {
		t.Fatalf("no limit: %v", err)
	}
	m2 := NewMemFS(m.Files())
	if m2.Used() != m.Used() || m.Used() != int64(NodeOverhead+len("/big")+1<<20) {
		t.Fatalf("Used %d after the round trip, %d before", m2.Used(), m.Used())
	}
	m2.Limit = m2.Used() + 10
	if err := upload(m2, "/x", nil); !isENOSPC(err) {
		t.Fatalf("a restored full tree: %v", err)
	}
}

// Through the agent, a write past the limit is an error frame that reads
// as a full tmpfs does on a real guest, and nothing is kept of it.
func TestMemFSLimitOverTheWire(t *testing.T) {
	m := NewMemFS(nil)
	m.Limit = 1 << 20
	c := client(t, serve(t, &Server{FS: m}))
	ctx := testCtx(t)
	err := c.WriteFile(ctx, silkd.FsWrite{Path: "/f"}, bytes.NewReader(make([]byte, 2<<20)))
	if !errors.Is(err, silkd.ErrInternal) || !strings.Contains(err.Error(), syscall.ENOSPC.Error()) {
		t.Fatalf("fs_write past the limit = %v, want internal: %s", err, syscall.ENOSPC)
	}
	if _, err := c.Stat(ctx, "/f"); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("the refused file: %v", err)
	}
	if m.Used() != 0 {
		t.Fatalf("Used = %d after a refused write", m.Used())
	}
	if err := c.WriteFile(ctx, silkd.FsWrite{Path: "/f"}, bytes.NewReader(make([]byte, 512<<10))); err != nil {
		t.Fatalf("a write that fits: %v", err)
	}
}
