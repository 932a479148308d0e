package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent/proctest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Issue 23's process ops on the real agent in a real guest under TCG, one
// VM: a session through a hibernate and wake, a terminal (stty size after
// pty_resize, Ctrl-C), and ps, logs and attach of a detached process.
func TestProcOpsWithQEMU(t *testing.T) {
	g := guesttest.Require(t)
	dir, err := os.MkdirTemp("", "qproc") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	killQEMUsOnCleanup(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, Log: zerolog.Nop(), StopGrace: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{RunDir: filepath.Join(dir, "run"), StoreDir: filepath.Join(dir, "store"), MemoryMiB: 256, Kernel: g.Kernel, Initrd: g.Initrd}
	if err := os.MkdirAll(spec.StoreDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = q.Destroy(context.Background(), spec) })
	proctest.Run(t, proctest.Agent{
		Dial: func(t *testing.T) *silkd.Conn {
			c, err := q.DialAgent(ctx, spec.RunDir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return silkd.NewConn(c)
		},
		Hibernate: func(t *testing.T) {
			start := time.Now()
			if _, err := q.Hibernate(ctx, spec, "hib"); err != nil {
				t.Fatal(err)
			}
			if _, err := q.Wake(ctx, spec, "hib"); err != nil {
				t.Fatal(err)
			}
			t.Logf("hibernate and wake: %v", time.Since(start))
		},
		Timeout: 2 * time.Minute,
	})
}
