package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent/silktest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Issue 23's tool-ops suite (silktest) in the busybox guest, through the
// project's client over the agent network: the whole-tree round trip
// (10 MiB, 1000 files; the watched file created by an exec of the guest's
// sh, sha256sum of the files in the guest), git with a bare repository in
// the same guest (made on the host and pushed: busybox has no git), and
// the language-server broker with a stub server run by the guest's
// busybox sh. One guest: TCG is slow. The Debian guest runs the same suite
// behind sandboxd in TestDebianQEMU (cmd/e2e).
func TestToolOpsWithQEMU(t *testing.T) {
	ctx, q, spec := bootTCG(t, "qto", 512, 25*time.Minute)
	dial := func(t testing.TB) *silkd.Conn {
		t.Helper()
		c, err := q.DialAgent(ctx, spec.RunDir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return silkd.NewConn(c)
	}
	silktest.Run(t, silktest.Agent{Dial: dial, Base: "/tmp", LSPDir: silkagent.DefaultLSPDir, Timeout: 10 * time.Minute})
}

// bootTCG boots one guest under TCG with memMiB of memory in a fresh
// directory named after prefix (short: socket paths), and returns the
// test's context (ending after limit), the recipes and the VM's spec. The
// guest is killed and its directory removed when the test ends.
func bootTCG(t *testing.T, prefix string, memMiB int, limit time.Duration) (context.Context, *Recipes, Spec) {
	t.Helper()
	g := guesttest.Require(t)
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	killQEMUsOnCleanup(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	q, err := NewRecipes(RecipesConfig{Accel: AccelTCG, Log: zerolog.Nop(), StopGrace: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{RunDir: filepath.Join(dir, "run"), StoreDir: filepath.Join(dir, "store"), MemoryMiB: memMiB, Kernel: g.Kernel, Initrd: g.Initrd}
	if err := os.MkdirAll(spec.StoreDir, 0o700); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := q.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("boot: %v", time.Since(start))
	return ctx, q, spec
}
