package silkagent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	gitclient "github.com/go-git/go-git/v5/plumbing/transport/client"
	"github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/plumbing/transport/server"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// The git ops are served by go-git inside the agent, not by the guest's
// git binary: the agent is one static binary that must serve the same ops
// in every guest (the busybox initramfs has no git, a Debian image may),
// in the simulated guest's tests on the host, and without a shell-out whose
// output has to be scraped. What differs from git(1): no hooks, no
// credential helpers (auth is a bearer token sent as an Authorization
// header, held in memory only), and git_pull fast-forwards only (a
// diverged branch is an internal error saying so; merge with git in the
// guest). Local repositories (a path or file:// URL) are reached in
// process, so push and pull between repositories of one guest need no git
// binary either.

// gitMaxAncestors bounds the commits git_status walks to count ahead and
// behind.
const gitMaxAncestors = 100_000

var installLocalTransport sync.Once

// gitOpen opens the repository at p (a missing path is not_found).
func gitOpen(op, p string) (*git.Repository, error) {
	if p == "" {
		return nil, badRequest("%s: path must not be empty", op)
	}
	if _, err := os.Stat(p); err != nil {
		return nil, err
	}
	r, err := git.PlainOpenWithOptions(p, &git.PlainOpenOptions{DetectDotGit: true})
	if errors.Is(err, git.ErrRepositoryNotExists) {
		return nil, silkd.Errorf(silkd.KindNotFound, "%s: %s is not in a git repository", op, p)
	}
	return r, err
}

// gitAuth is the bearer-token auth of a request, or nil.
func gitAuth(token string) transport.AuthMethod {
	if token == "" {
		return nil
	}
	return &http.TokenAuth{Token: token}
}

// gitFail makes a failed git operation an internal error frame naming it,
// as the old agent reported git's stderr ("git <verb>: <message>").
func gitFail(verb string, err error) error {
	var e *silkd.Error
	if errors.As(err, &e) || errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return silkd.Errorf(silkd.KindInternal, "git %s: %v", verb, err)
}

// gitOp runs the git op req and returns its answer.
func (s *Server) gitOp(req silkd.Request) (silkd.Response, error) {
	installLocalTransport.Do(func() {
		gitclient.InstallProtocol("file", server.DefaultServer)
	})
	switch v := req.(type) {
	case *silkd.GitClone:
		return s.gitClone(v)
	case *silkd.GitStatus:
		return s.gitStatus(v)
	case *silkd.GitAdd:
		return gitAdd(v)
	case *silkd.GitCommit:
		return s.gitCommit(v)
	case *silkd.GitPush:
		return s.gitPush(v)
	case *silkd.GitPull:
		return s.gitPull(v)
	case *silkd.GitBranch:
		return gitBranch(v)
	}
	return nil, fmt.Errorf("%s is not a git op", req.Op())
}

func (s *Server) gitClone(req *silkd.GitClone) (silkd.Response, error) {
	if req.URL == "" || req.Path == "" {
		return nil, badRequest("git_clone: url and path must not be empty")
	}
	if err := s.needEgress(req.URL); err != nil {
		return nil, err
	}
	opts := &git.CloneOptions{URL: req.URL, Depth: int(req.Depth), Auth: gitAuth(req.Auth)}
	if req.Branch != "" {
		opts.ReferenceName = plumbing.NewBranchReferenceName(req.Branch)
		opts.SingleBranch = true
	}
	if _, err := git.PlainClone(req.Path, false, opts); err != nil {
		return nil, gitFail("clone", err)
	}
	return silkd.Done{}, nil
}

// porcelain maps a go-git status code to git's porcelain v2 letter.
func porcelain(c git.StatusCode) string {
	if c == git.Unmodified {
		return "."
	}
	return string(rune(c))
}

func (s *Server) gitStatus(req *silkd.GitStatus) (silkd.Response, error) {
	r, err := gitOpen(silkd.OpGitStatus, req.Path)
	if err != nil {
		return nil, err
	}
	wt, err := r.Worktree()
	if err != nil {
		return nil, gitFail("status", err)
	}
	st, err := wt.Status()
	if err != nil {
		return nil, gitFail("status", err)
	}
	res := silkd.GitStatusResult{Files: []silkd.GitFileStatus{}}
	res.Branch, err = currentBranch(r)
	if err != nil {
		return nil, gitFail("status", err)
	}
	paths := make([]string, 0, len(st))
	for p := range st {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	limit := s.Limits.withDefaults().GitStatusFiles
	for _, p := range paths {
		fst := st[p]
		if fst.Staging == git.Unmodified && fst.Worktree == git.Unmodified {
			continue
		}
		if len(res.Files) == limit {
			res.Truncated = true
			break
		}
		res.Files = append(res.Files, silkd.GitFileStatus{Path: p, Staged: porcelain(fst.Staging), Unstaged: porcelain(fst.Worktree)})
	}
	res.Ahead, res.Behind = aheadBehind(r, res.Branch)
	return res, nil
}

// currentBranch is HEAD's branch, "HEAD" when detached (as
// `git rev-parse --abbrev-ref HEAD` says).
func currentBranch(r *git.Repository) (string, error) {
	head, err := r.Reference(plumbing.HEAD, false)
	if err != nil {
		return "", err
	}
	if head.Type() == plumbing.SymbolicReference {
		return head.Target().Short(), nil
	}
	return "HEAD", nil
}

// upstream is the remote and remote branch that branch tracks: its
// configuration, else origin's branch of the same name.
func upstream(r *git.Repository, branch string) (remote string, merge plumbing.ReferenceName) {
	remote, merge = "origin", plumbing.NewBranchReferenceName(branch)
	if cfg, err := r.Config(); err == nil {
		if b, ok := cfg.Branches[branch]; ok {
			if b.Remote != "" {
				remote = b.Remote
			}
			if b.Merge != "" {
				merge = b.Merge
			}
		}
	}
	return remote, merge
}

// aheadBehind counts the commits HEAD has that its upstream's tracking ref
// lacks and the other way round; 0, 0 without an upstream.
func aheadBehind(r *git.Repository, branch string) (uint32, uint32) {
	head, err := r.Head()
	if err != nil {
		return 0, 0
	}
	remote, merge := upstream(r, branch)
	up, err := r.Reference(plumbing.NewRemoteReferenceName(remote, merge.Short()), true)
	if err != nil {
		return 0, 0
	}
	mine, theirs := ancestors(r, head.Hash()), ancestors(r, up.Hash())
	var ahead, behind uint32
	for h := range mine {
		if _, ok := theirs[h]; !ok {
			ahead++
		}
	}
	for h := range theirs {
		if _, ok := mine[h]; !ok {
			behind++
		}
	}
	return ahead, behind
}

// ancestors is from and the commits it reaches, at most gitMaxAncestors.
func ancestors(r *git.Repository, from plumbing.Hash) map[plumbing.Hash]struct{} {
	out := map[plumbing.Hash]struct{}{}
	todo := []plumbing.Hash{from}
	for len(todo) > 0 && len(out) < gitMaxAncestors {
		h := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if _, ok := out[h]; ok {
			continue
		}
		c, err := r.CommitObject(h)
		if err != nil {
			continue // a shallow clone's boundary
		}
		out[h] = struct{}{}
		todo = append(todo, c.ParentHashes...)
	}
	return out
}

func gitAdd(req *silkd.GitAdd) (silkd.Response, error) {
	r, err := gitOpen(silkd.OpGitAdd, req.Path)
	if err != nil {
		return nil, err
	}
	if len(req.Files) == 0 {
		return nil, badRequest("git_add: files must not be empty")
	}
	wt, err := r.Worktree()
	if err != nil {
		return nil, gitFail("add", err)
	}
	root := wt.Filesystem.Root()
	for _, f := range req.Files {
		rel := f
		if filepath.IsAbs(f) {
			if rel, err = filepath.Rel(root, f); err != nil || strings.HasPrefix(rel, "..") {
				return nil, badRequest("git_add: %s is outside the repository %s", f, root)
			}
		}
		if _, err := wt.Add(rel); err != nil {
			return nil, gitFail("add", err)
		}
	}
	return silkd.Done{}, nil
}

// splitAuthor splits "Name <email>"; without the angle form the whole
// string is the name.
func splitAuthor(author string) (name, email string) {
	open := strings.Index(author, "<")
	if open >= 0 {
		if end := strings.Index(author[open:], ">"); end >= 0 {
			return strings.TrimSpace(author[:open]), author[open+1 : open+end]
		}
	}
	return strings.TrimSpace(author), ""
}

func (s *Server) gitCommit(req *silkd.GitCommit) (silkd.Response, error) {
	r, err := gitOpen(silkd.OpGitCommit, req.Path)
	if err != nil {
		return nil, err
	}
	if req.Message == "" || req.Author == "" {
		return nil, badRequest("git_commit: message and author must not be empty")
	}
	wt, err := r.Worktree()
	if err != nil {
		return nil, gitFail("commit", err)
	}
	name, email := splitAuthor(req.Author)
	// A fresh guest has no identity configured: the author commits.
	sig := &object.Signature{Name: name, Email: email, When: s.now()}
	h, err := wt.Commit(req.Message, &git.CommitOptions{Author: sig, Committer: sig})
	if errors.Is(err, git.ErrEmptyCommit) {
		return nil, silkd.Errorf(silkd.KindInternal, "git commit: nothing to commit")
	}
	if err != nil {
		return nil, gitFail("commit", err)
	}
	return silkd.GitCommitResult{Hash: h.String()}, nil
}

// onBranch opens the repository at p, which must have a branch checked
// out, for verb.
func onBranch(op, verb, p string) (*git.Repository, string, error) {
	r, err := gitOpen(op, p)
	if err != nil {
		return nil, "", err
	}
	branch, err := currentBranch(r)
	if err != nil || branch == "HEAD" {
		return nil, "", silkd.Errorf(silkd.KindInternal, "git %s: not on a branch", verb)
	}
	return r, branch, nil
}

func (s *Server) gitPush(req *silkd.GitPush) (silkd.Response, error) {
	r, branch, err := onBranch(silkd.OpGitPush, "push", req.Path)
	if err != nil {
		return nil, err
	}
	remote, merge := upstream(r, branch)
	if err := s.needEgress(remoteURL(r, remote)); err != nil {
		return nil, err
	}
	spec := config.RefSpec(plumbing.NewBranchReferenceName(branch).String() + ":" + merge.String())
	err = r.Push(&git.PushOptions{RemoteName: remote, RefSpecs: []config.RefSpec{spec}, Auth: gitAuth(req.Auth)})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return nil, gitFail("push", err)
	}
	return silkd.Done{}, nil
}

func (s *Server) gitPull(req *silkd.GitPull) (silkd.Response, error) {
	r, branch, err := onBranch(silkd.OpGitPull, "pull", req.Path)
	if err != nil {
		return nil, err
	}
	remote, merge := upstream(r, branch)
	if err := s.needEgress(remoteURL(r, remote)); err != nil {
		return nil, err
	}
	wt, err := r.Worktree()
	if err != nil {
		return nil, gitFail("pull", err)
	}
	err = wt.Pull(&git.PullOptions{RemoteName: remote, ReferenceName: merge, Auth: gitAuth(req.Auth)})
	if errors.Is(err, git.ErrNonFastForwardUpdate) {
		return nil, silkd.Errorf(silkd.KindInternal, "git pull: the branches have diverged; this agent pulls fast-forward only")
	}
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return nil, gitFail("pull", err)
	}
	return silkd.Done{}, nil
}

func gitBranch(req *silkd.GitBranch) (silkd.Response, error) {
	r, err := gitOpen(silkd.OpGitBranch, req.Path)
	if err != nil {
		return nil, err
	}
	cur, err := currentBranch(r)
	if err != nil {
		return nil, gitFail("branch", err)
	}
	if req.Action == "list" {
		it, err := r.Branches()
		if err != nil {
			return nil, gitFail("branch", err)
		}
		res := silkd.GitBranches{Current: cur, Branches: []string{}}
		_ = it.ForEach(func(ref *plumbing.Reference) error {
			res.Branches = append(res.Branches, ref.Name().Short())
			return nil
		})
		sort.Strings(res.Branches)
		return res, nil
	}
	switch req.Action {
	case "create", "delete", "checkout":
	default:
		return nil, badRequest("git_branch: action must be one of %s", strings.Join(silkd.GitBranchActions, ", "))
	}
	if req.Name == "" {
		return nil, badRequest("branch op needs a name")
	}
	ref := plumbing.NewBranchReferenceName(req.Name)
	if err := ref.Validate(); err != nil {
		return nil, badRequest("git_branch: %q is not a valid branch name", req.Name)
	}
	switch req.Action {
	case "create":
		head, err := r.Head()
		if err != nil {
			return nil, gitFail("branch", fmt.Errorf("no commit to branch from: %w", err))
		}
		if _, err := r.Reference(ref, false); err == nil {
			return nil, gitFail("branch", fmt.Errorf("a branch named %q already exists", req.Name))
		}
		err = r.Storer.SetReference(plumbing.NewHashReference(ref, head.Hash()))
	case "delete":
		if req.Name == cur {
			return nil, gitFail("branch", fmt.Errorf("cannot delete the checked out branch %q", req.Name))
		}
		if _, err := r.Reference(ref, false); err != nil {
			return nil, gitFail("branch", fmt.Errorf("branch %q not found", req.Name))
		}
		err = r.Storer.RemoveReference(ref)
	case "checkout":
		var wt *git.Worktree
		if wt, err = r.Worktree(); err == nil {
			err = wt.Checkout(&git.CheckoutOptions{Branch: ref})
		}
	}
	if err != nil {
		return nil, gitFail("branch", err)
	}
	return silkd.Done{}, nil
}
