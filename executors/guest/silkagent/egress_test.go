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

// TestHasDefaultRoute reads the kernel's IPv4 route table: a none-lane
// QEMU guest has a NIC and a link route but no default route (its IPv6
// default route, advertised by the restricted user network, is no way
// out and is not read); the egress lane's network verb adds one.
func TestHasDefaultRoute(t *testing.T) {
	const (
		head    = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
		link    = "eth0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
		deflt   = "eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
		missing = "\x00"
	)
	for _, tc := range []struct {
		name  string
		table string
		want  bool
	}{
		{"link route only (none lane)", head + link, false},
		{"default route (egress lane)", head + link + deflt, true},
		{"header only", head, false},
		{"no route table", missing, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "route")
			if tc.table != missing {
				if err := os.WriteFile(p, []byte(tc.table), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			old := ipv4Routes
			ipv4Routes = p
			t.Cleanup(func() { ipv4Routes = old })
			if got := hasDefaultRoute(); got != tc.want {
				t.Fatalf("hasDefaultRoute = %v, want %v", got, tc.want)
			}
		})
	}
}
