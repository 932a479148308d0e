package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// envBeSbxctl makes the test binary run as sbxctl (TestMain), so a shell
// the tests start can call "sbxctl" without a build.
const envBeSbxctl = "SBXCTL_TEST_BE_SBXCTL"

func TestMain(m *testing.M) {
	if os.Getenv(envBeSbxctl) == "1" {
		os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// sbxctlOnPath puts the test binary on PATH as "sbxctl".
func sbxctlOnPath(t *testing.T) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(exe, filepath.Join(dir, "sbxctl")); err != nil {
		t.Fatal(err)
	}
	return append(os.Environ(), envBeSbxctl+"=1", "PATH="+dir+":"+os.Getenv("PATH"))
}

// The bash script loads in bash and completes command names, second
// words, and a command's flags (asked of sbxctl help at completion time).
func TestCompletionBashLoads(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	env := sbxctlOnPath(t)
	for _, tc := range []struct {
		words string
		cword int
		want  []string
	}{
		{"sbxctl cl", 1, []string{"claim"}},
		{"sbxctl lo", 1, []string{"log", "logs"}},
		{"sbxctl log v", 2, []string{"verify"}},
		{"sbxctl claim --tem", 2, []string{"--template"}},
		{"sbxctl pools set --warm-", 3, []string{"--warm-max"}},
		{"sbxctl help rel", 2, []string{"release"}},
	} {
		t.Run(tc.words, func(t *testing.T) {
			script := `set -e
source <(sbxctl completion bash)
complete -p sbxctl >/dev/null
COMP_WORDS=(` + tc.words + `)
COMP_CWORD=` + string(rune('0'+tc.cword)) + `
_sbxctl
echo "${COMPREPLY[*]}"`
			cmd := exec.Command(bash, "-c", script)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("bash: %v\n%s", err, out)
			}
			if got := strings.Fields(string(out)); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("completions %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCompletionUsage(t *testing.T) {
	if code, _, errs := sbx("completion", "fish"); code != 2 || !strings.Contains(errs, "bash|zsh") {
		t.Fatalf("fish: exit %d, %q", code, errs)
	}
	code, out, _ := sbx("completion", "zsh")
	if code != 0 || !strings.Contains(out, "bashcompinit") || !strings.Contains(out, "complete -o default -F _sbxctl sbxctl") {
		t.Fatalf("zsh: exit %d\n%s", code, out)
	}
}
