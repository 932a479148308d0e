package silkd

import "maps"

// The golden frames of the tool ops (fs_replace, git_*, lsp_*), kept apart
// from golden_test.go's tables so each op family owns its expectations.
func init() {
	maps.Copy(wantRequests, map[string]Request{
		"req_fs_replace":  &FsReplace{Files: []string{"/work/a.txt", "/work/b.txt"}, Pattern: "foo", Replacement: "bar"},
		"req_git_clone":   &GitClone{URL: "https://github.com/x/y.git", Path: "/work/y", Branch: "main", Depth: 1, Auth: "x-token-1"},
		"req_git_status":  &GitStatus{Path: "/work/y"},
		"req_git_add":     &GitAdd{Path: "/work/y", Files: []string{"a.txt", "b.txt"}},
		"req_git_commit":  &GitCommit{Path: "/work/y", Message: "fix bug", Author: "Dev <dev@example.com>"},
		"req_git_push":    &GitPush{Path: "/work/y", Auth: "x-token-1"},
		"req_git_pull":    &GitPull{Path: "/work/y", Auth: "x-token-1"},
		"req_git_branch":  &GitBranch{Path: "/work/y", Action: "create", Name: "feature"},
		"req_lsp_start":   &LspStart{Language: "python", Root: "/workspace"},
		"req_lsp_request": &LspRequest{ServerID: "lsp-1"},
		"req_lsp_stop":    &LspStop{ServerID: "lsp-1"},
	})
	maps.Copy(wantResponses, map[string]Response{
		"resp_replaced":          &Replaced{File: "/work/a.txt", Replacements: 3},
		"resp_lsp_started":       &LspStarted{ServerID: "lsp-1"},
		"resp_git_commit_result": &GitCommitResult{Hash: "0123456789abcdef0123456789abcdef01234567"},
		"resp_git_branches":      &GitBranches{Current: "main", Branches: []string{"main", "feature"}},
		"resp_git_status_result": &GitStatusResult{Branch: "main", Ahead: 1, Files: []GitFileStatus{{Path: "a.txt", Staged: "M", Unstaged: "."}}},
		"resp_git_status_result_truncated": &GitStatusResult{Branch: "main",
			Files: []GitFileStatus{{Path: "a.txt", Staged: "?", Unstaged: "?"}}, Truncated: true},
	})
}
