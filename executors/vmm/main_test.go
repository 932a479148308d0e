package vmm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/ch/chsimbin"
)

var chsimBin string

// envLaunch makes the test binary act as a daemon that launches one VMM and
// exits at once, leaving the VMM behind as a crashed daemon would.
const envLaunch = "SBX_VMM_TEST_LAUNCH"

type launchSpec struct {
	Binary, RunDir, ID, CgroupSlice string
	Env                             []string
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(envLaunch); spec != "" {
		os.Exit(launcherMain(spec))
	}
	// Orphaned VMMs get reparented to this process, which reaps them when
	// they exit (instead of leaving that to whatever pid 1 is here).
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	os.Exit(chsimbin.RunTests(m, &chsimBin))
}

func launcherMain(spec string) int {
	var s launchSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	p, err := Launch(context.Background(), Config{Binary: s.Binary, RunDir: s.RunDir, ID: s.ID, CgroupSlice: s.CgroupSlice, Env: s.Env})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(p.Pid())
	return 0
}

// launchInHelper launches a VMM from a separate, short-lived process and
// returns its pid once that process has exited.
func launchInHelper(t *testing.T, s launchSpec) int {
	t.Helper()
	spec, _ := json.Marshal(s)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// GORACE: a -race binary otherwise lingers a second at exit.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), envLaunch+"="+string(spec), "GORACE="+gorace)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("launcher: %v\n%s", err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("launcher printed %q", out)
	}
	t.Cleanup(func() {
		if processLive(pid) {
			if ok, _ := matchCmdline(pid, s.Binary, filepath.Join(s.RunDir, SocketFile)); ok {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	})
	return pid
}

func shortDir(t *testing.T) string { return chsimbin.ShortTempDir(t) }

// testSlice is a cgroup v2 slice for this test, or "" (with the reason
// logged) where the cgroup tree is not writable.
func testSlice(t *testing.T) string {
	t.Helper()
	m := cgroup2Mount()
	if m == "" {
		t.Log("no cgroup v2 hierarchy mounted: testing without scopes")
		return ""
	}
	slice, err := os.MkdirTemp(m, "sbxlog-test-")
	if err != nil {
		t.Logf("cgroup v2 tree at %s not writable (%v): testing without scopes", m, err)
		return ""
	}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(slice)
		for _, e := range entries {
			if e.IsDir() {
				removeScope(filepath.Join(slice, e.Name()))
			}
		}
		removeScope(slice)
	})
	return slice
}
