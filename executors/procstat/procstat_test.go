package procstat

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

func TestParse(t *testing.T) {
	page := int64(os.Getpagesize())
	for _, tc := range []struct {
		name        string
		statm, stat string
		rss         int64
		cpu         float64
		bad         bool
	}{
		{name: "plain", statm: "1000 250 10 1 0 300 0\n", stat: "42 (chsim) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 3 0 100 1000 250\n", rss: 250 * page, cpu: 2},
		{name: "command with spaces and parens", statm: "1 2 3 4 5 6 7", stat: "7 (a b) (c)) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1", rss: 2 * page, cpu: 0.07},
		{name: "short statm", statm: "1", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 1 1", bad: true},
		{name: "short stat", statm: "1 2", stat: "1 (x) S 1 1", bad: true},
		{name: "no command", statm: "1 2", stat: "1 x S", bad: true},
		{name: "bad ticks", statm: "1 2", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 a 1", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rss, err1 := residentBytes([]byte(tc.statm))
			cpu, err2 := cpuSeconds([]byte(tc.stat))
			if tc.bad {
				if err1 == nil && err2 == nil {
					t.Fatalf("parsed %d bytes, %v s; want an error", rss, cpu)
				}
				return
			}
			if err1 != nil || err2 != nil || rss != tc.rss || cpu != tc.cpu {
				t.Fatalf("got %d bytes (%v), %v s (%v); want %d, %v", rss, err1, cpu, err2, tc.rss, tc.cpu)
			}
		})
	}
}

// TestReadSelf reads this test process: it is resident and has used CPU.
func TestReadSelf(t *testing.T) {
	for i := 0; i < 1e7; i++ { // some CPU time, so it is measurable
		_ = i * i
	}
	u, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.Pid != os.Getpid() || u.RSSBytes < int64(os.Getpagesize()) || u.CPUSeconds < 0 {
		t.Fatalf("usage %+v", u)
	}
}

// TestReadGone: a process that exited (and was reaped) is ErrNoProcess.
func TestReadGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	if _, err := Read(cmd.Process.Pid); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("exited pid %d: %v, want ErrNoProcess", cmd.Process.Pid, err)
	}
	if _, err := Read(0); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("pid 0: %v, want ErrNoProcess", err)
	}
}
