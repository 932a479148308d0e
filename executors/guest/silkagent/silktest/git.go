package silktest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// tarDir archives a host directory (regular files and directories).
func tarDir(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// initRepos starts base/work, whose origin is base/bare.git, and that
// bare repository: with the guest's git where it has one (git init, as a
// user would), else made on the host and pushed into the guest (the
// protocol has no git_init, and a guest without git has no other way).
func initRepos(t testing.TB, ctx context.Context, a Agent, c *silkd.Conn, base string) {
	if a.GitBinary {
		guestRun(t, ctx, c, "sh", "-c", `set -e; mkdir -p "$1"; cd "$1"
git init -q --initial-branch=master work
git init -q --bare --initial-branch=master bare.git
git -C work remote add origin "$1/bare.git"`, "sh", base)
		return
	}
	host := t.TempDir()
	work, err := git.PlainInit(host+"/work", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := work.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{base + "/bare.git"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := git.PlainInit(host+"/bare.git", true); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"work", "bare.git"} {
		if err := c.Push(ctx, base+"/"+r, bytes.NewReader(tarDir(t, host+"/"+r))); err != nil {
			t.Fatal(err)
		}
	}
}

// gitSays runs the guest's git in dir and returns its output, trimmed.
func gitSays(t testing.TB, ctx context.Context, c *silkd.Conn, dir string, args ...string) string {
	t.Helper()
	return strings.TrimSpace(guestRun(t, ctx, c, append([]string{"git", "-C", dir}, args...)...))
}

var hash = regexp.MustCompile(`^[0-9a-f]{40}$`)

// Git is acceptance 5: a repository started in the guest, add, commit,
// status and branch through the git ops, then a push to a bare repository
// in the same guest, a clone of it, a commit pushed from the clone and
// pulled into the first repository. Where the guest has git, git itself
// reads back what the git ops wrote (commits, index, refs). The simulated
// guest answers every git op unimplemented, saying it is simulated.
func Git(t testing.TB, a Agent) {
	ctx := a.ctx(t)
	c := a.Dial(t)
	base := a.Base + "/git"
	if a.Simulated {
		_, err := c.GitStatus(ctx, a.Base)
		notSimulated(t, "git_status", err)
		notSimulated(t, "git_clone", c.GitClone(ctx, silkd.GitClone{URL: a.Base + "/x", Path: a.Base + "/y"}))
		notSimulated(t, "git_commit", func() error { _, err := c.GitCommit(ctx, a.Base, "m", "A <a@example.com>"); return err }())
		return
	}
	start := time.Now()
	if err := c.Mkdir(ctx, base, true); err != nil {
		t.Fatal(err)
	}
	initRepos(t, ctx, a, c, base)
	work := base + "/work"
	write := func(p, data string) {
		t.Helper()
		if err := c.WriteFile(ctx, silkd.FsWrite{Path: p}, strings.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	status := func(dir string) *silkd.GitStatusResult {
		t.Helper()
		st, err := c.GitStatus(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	write(work+"/a.txt", "one\n")
	if st := status(work); st.Branch != "master" || len(st.Files) != 1 || st.Files[0] != (silkd.GitFileStatus{Path: "a.txt", Staged: "?", Unstaged: "?"}) {
		t.Fatalf("status of an untracked file: %+v", st)
	}
	if err := c.GitAdd(ctx, work, []string{"a.txt"}); err != nil {
		t.Fatal(err)
	}
	if st := status(work); len(st.Files) != 1 || st.Files[0].Staged != "A" || st.Files[0].Unstaged != "." {
		t.Fatalf("status of a staged file: %+v", st)
	}
	h, err := c.GitCommit(ctx, work, "first", "Dev <dev@example.com>")
	if err != nil || !hash.MatchString(h) {
		t.Fatalf("commit = %q, %v", h, err)
	}
	if st := status(work); len(st.Files) != 0 {
		t.Fatalf("status after the commit: %+v", st)
	}
	if a.GitBinary {
		if got := gitSays(t, ctx, c, work, "log", "--format=%H %an <%ae> %s"); got != h+" Dev <dev@example.com> first" {
			t.Fatalf("git log of the commit made by git_commit: %q", got)
		}
		if got := gitSays(t, ctx, c, work, "status", "--porcelain"); got != "" {
			t.Fatalf("git status after git_commit: %q, want clean", got)
		}
	}
	if _, err := c.GitCommit(ctx, work, "again", "Dev <dev@example.com>"); !errors.Is(err, silkd.ErrInternal) || !strings.Contains(err.Error(), "nothing to commit") {
		t.Fatalf("an empty commit = %v", err)
	}

	if err := c.GitBranch(ctx, work, "create", "feature"); err != nil {
		t.Fatal(err)
	}
	br, err := c.GitBranches(ctx, work)
	if err != nil || br.Current != "master" || !slices.Equal(br.Branches, []string{"feature", "master"}) {
		t.Fatalf("branches %+v, %v", br, err)
	}
	if err := c.GitBranch(ctx, work, "checkout", "feature"); err != nil {
		t.Fatal(err)
	}
	if br, err := c.GitBranches(ctx, work); err != nil || br.Current != "feature" {
		t.Fatalf("after checkout: %+v, %v", br, err)
	}
	if err := c.GitBranch(ctx, work, "delete", "feature"); !errors.Is(err, silkd.ErrInternal) {
		t.Fatalf("deleting the checked out branch = %v", err)
	}
	if err := c.GitBranch(ctx, work, "checkout", "master"); err != nil {
		t.Fatal(err)
	}
	if err := c.GitBranch(ctx, work, "delete", "feature"); err != nil {
		t.Fatal(err)
	}
	if err := c.GitBranch(ctx, work, "create", ""); !errors.Is(err, silkd.ErrBadRequest) {
		t.Fatalf("create without a name = %v", err)
	}
	if err := c.GitBranch(ctx, work, "rebase", "x"); !errors.Is(err, silkd.ErrBadRequest) {
		t.Fatalf("an unknown action = %v", err)
	}
	if _, err := c.GitStatus(ctx, base+"/nope"); !errors.Is(err, silkd.ErrNotFound) {
		t.Fatalf("status of a missing path = %v", err)
	}

	// Push to the bare repository, clone it, commit in the clone, push, pull.
	if err := c.GitPush(ctx, work, ""); err != nil {
		t.Fatal(err)
	}
	clone := base + "/clone"
	if err := c.GitClone(ctx, silkd.GitClone{URL: base + "/bare.git", Path: clone}); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := c.ReadFile(ctx, clone+"/a.txt", &got); err != nil || got.String() != "one\n" {
		t.Fatalf("the clone's a.txt: %q, %v", got.String(), err)
	}
	write(clone+"/b.txt", "two\n")
	if err := c.GitAdd(ctx, clone, []string{clone + "/b.txt"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GitCommit(ctx, clone, "second", "Other <other@example.com>"); err != nil {
		t.Fatal(err)
	}
	if st := status(clone); st.Ahead != 1 || st.Behind != 0 {
		t.Fatalf("the clone before its push: %+v", st)
	}
	if err := c.GitPush(ctx, clone, ""); err != nil {
		t.Fatal(err)
	}
	if st := status(clone); st.Ahead != 0 {
		t.Fatalf("the clone after its push: %+v", st)
	}
	if err := c.GitPull(ctx, work, ""); err != nil {
		t.Fatal(err)
	}
	got.Reset()
	if _, err := c.ReadFile(ctx, work+"/b.txt", &got); err != nil || got.String() != "two\n" {
		t.Fatalf("the pulled b.txt: %q, %v", got.String(), err)
	}
	if err := c.GitPull(ctx, work, ""); err != nil {
		t.Fatalf("a pull with nothing new = %v", err)
	}
	if a.GitBinary {
		for _, dir := range []string{work, base + "/bare.git"} {
			if got := gitSays(t, ctx, c, dir, "log", "--format=%s", "master"); got != "second\nfirst" {
				t.Fatalf("git log in %s after the push and pull: %q", dir, got)
			}
		}
		gitSays(t, ctx, c, base+"/bare.git", "fsck", "--no-progress")
		if got := gitSays(t, ctx, c, work, "status", "--porcelain"); got != "" {
			t.Fatalf("git status after git_pull: %q, want clean", got)
		}
	}
	t.Logf("git: init, add, commit, status, branch, push, clone, pull: %v", time.Since(start))
}
