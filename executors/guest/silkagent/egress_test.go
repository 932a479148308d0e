package silkagent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// gitRepos makes, on the host, a bare repository and a work repository
// with one commit on master whose origin is originURL.
func gitRepos(t *testing.T, originURL string) (bare, work string) {
	t.Helper()
	dir := t.TempDir()
	bare, work = filepath.Join(dir, "bare.git"), filepath.Join(dir, "work")
	if _, err := git.PlainInit(bare, true); err != nil {
		t.Fatal(err)
	}
	r, err := git.PlainInit(work, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "a.txt"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wt, err := r.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wt.Add("a.txt"); err != nil {
		t.Fatal(err)
	}
	sig := &object.Signature{Name: "T", Email: "t@example.com", When: time.Unix(1, 0)}
	if _, err := wt.Commit("one", &git.CommitOptions{Author: sig, Committer: sig}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{originURL}}); err != nil {
		t.Fatal(err)
	}
	return bare, work
}

// TestGitNetworkOpsWithoutEgress: on a guest without egress (the none
// lane) a clone, push or pull that must reach another machine is answered
// unimplemented naming fs_push, as the old agent answered, not an internal
// dial error; a local repository is still served; with egress the op is
// tried (a closed port is an internal error, not unimplemented).
func TestGitNetworkOpsWithoutEgress(t *testing.T) {
	const closed = "https://127.0.0.1:1/x.git"
	bare, work := gitRepos(t, closed)
	_, localWork := gitRepos(t, bare)
	for _, tc := range []struct {
		name   string
		egress bool
		run    func(c *silkd.Conn) error
		want   *silkd.Error // nil: the op succeeds
	}{
		{"clone https, no egress", false, func(c *silkd.Conn) error {
			return c.GitClone(testCtx(t), silkd.GitClone{URL: closed, Path: filepath.Join(t.TempDir(), "x")})
		}, silkd.ErrUnimplemented},
		{"clone scp-style ssh, no egress", false, func(c *silkd.Conn) error {
			return c.GitClone(testCtx(t), silkd.GitClone{URL: "git@example.com:x/y.git", Path: filepath.Join(t.TempDir(), "x")})
		}, silkd.ErrUnimplemented},
		{"push to https origin, no egress", false, func(c *silkd.Conn) error {
			return c.GitPush(testCtx(t), work, "")
		}, silkd.ErrUnimplemented},
		{"pull from https origin, no egress", false, func(c *silkd.Conn) error {
			return c.GitPull(testCtx(t), work, "")
		}, silkd.ErrUnimplemented},
		{"push to a local bare repository, no egress", false, func(c *silkd.Conn) error {
			return c.GitPush(testCtx(t), localWork, "")
		}, nil},
		{"clone a local path, no egress", false, func(c *silkd.Conn) error {
			return c.GitClone(testCtx(t), silkd.GitClone{URL: filepath.Join(localWork, ".git"), Path: filepath.Join(t.TempDir(), "x")})
		}, nil},
		{"clone https, egress", true, func(c *silkd.Conn) error {
			return c.GitClone(testCtx(t), silkd.GitClone{URL: closed, Path: filepath.Join(t.TempDir(), "x")})
		}, silkd.ErrInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			egress := tc.egress
			c := client(t, serve(t, &Server{Git: true, Egress: func() bool { return egress }}))
			err := tc.run(c)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("got %v, want success", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("got %v, want kind %s", err, tc.want.Kind)
			case tc.want == silkd.ErrUnimplemented && !strings.Contains(err.Error(), "fs_push"):
				t.Fatalf("%v does not point at fs_push", err)
			}
		})
	}
}

// TestHasDefaultRoute reads the kernel's route tables: a none-lane QEMU
// guest has a NIC and a link route but no default route; the kernel's
// unreachable ::/0 on lo is no way out.
func TestHasDefaultRoute(t *testing.T) {
	const (
		v4Head    = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
		v4Link    = "eth0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
		v4Default = "eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
		zero      = "00000000000000000000000000000000"
		v6LoUnrch = zero + " 00 " + zero + " 00 " + zero + " ffffffff 00000001 00000000 00200200       lo\n"
		v6Default = zero + " 00 " + zero + " 00 fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0\n"
	)
	for _, tc := range []struct {
		name   string
		v4, v6 string
		want   bool
	}{
		{"link route only (none lane)", v4Head + v4Link, v6LoUnrch, false},
		{"IPv4 default route (egress lane)", v4Head + v4Link + v4Default, v6LoUnrch, true},
		{"IPv6 default route", v4Head + v4Link, v6LoUnrch + v6Default, true},
		{"no route tables", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			v4, v6 := filepath.Join(dir, "route"), filepath.Join(dir, "ipv6_route")
			for p, s := range map[string]string{v4: tc.v4, v6: tc.v6} {
				if s == "" {
					continue
				}
				if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			old4, old6 := ipv4Routes, ipv6Routes
			ipv4Routes, ipv6Routes = v4, v6
			t.Cleanup(func() { ipv4Routes, ipv6Routes = old4, old6 })
			if got := hasDefaultRoute(); got != tc.want {
				t.Fatalf("hasDefaultRoute = %v, want %v", got, tc.want)
			}
		})
	}
}
