package xfstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	xfsMagic   = 0x58465342
	ext4Magic  = 0xEF53
	tmpfsMagic = 0x01021994
)

func mounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// Each mount is the filesystem it claims to be, writable, and gone (with its loop
// device) once the test that made it has finished.
func TestMountKindsAndCleanup(t *testing.T) {
	cases := []struct {
		name  string
		magic int64
		mount func(t *testing.T) string
	}{
		{"xfs", xfsMagic, func(t *testing.T) string { return Mount(t, 64<<20) }}, // raised to MinXFSSize
		{"tmpfs", tmpfsMagic, func(t *testing.T) string { return MountNoReflink(t, 64<<20, Tmpfs) }},
		{"ext4", ext4Magic, func(t *testing.T) string { return MountNoReflink(t, 64<<20, Ext4) }},
	}
	for _, tc := range cases {
		var dir string
		t.Run(tc.name, func(t *testing.T) {
			dir = tc.mount(t)
			var st unix.Statfs_t
			if err := unix.Statfs(dir, &st); err != nil {
				t.Fatal(err)
			}
			if st.Type != tc.magic {
				t.Fatalf("%s is fs type %#x, want %#x", dir, st.Type, tc.magic)
			}
			if !mounted(t, dir) {
				t.Fatalf("%s not in mountinfo", dir)
			}
			if err := os.WriteFile(filepath.Join(dir, "probe"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		})
		if dir == "" {
			continue // skipped
		}
		if mounted(t, dir) {
			t.Fatalf("%s: %s still mounted after its test", tc.name, dir)
		}
		if _, err := os.Stat(filepath.Dir(dir)); !os.IsNotExist(err) {
			t.Fatalf("%s: temp dir %s not removed: %v", tc.name, filepath.Dir(dir), err)
		}
		out, err := exec.Command("losetup", "-a").CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), filepath.Dir(dir)) {
			t.Fatalf("%s: loop device left behind: %s", tc.name, out)
		}
	}
}

// TestUnavailableHelper is run in a child process by TestUnavailableSkipsOrFails.
func TestUnavailableHelper(t *testing.T) {
	if os.Getenv("XFSTEST_CHILD") != "1" {
		t.Skip("only runs as a child of TestUnavailableSkipsOrFails")
	}
	Unavailable(t, "no xfs here")
}

func TestUnavailableSkipsOrFails(t *testing.T) {
	for _, tc := range []struct {
		require string
		want    string
		fails   bool
	}{
		{"", "--- SKIP: TestUnavailableHelper", false},
		{"1", "--- FAIL: TestUnavailableHelper", true},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUnavailableHelper$", "-test.v")
		cmd.Env = append(os.Environ(), "XFSTEST_CHILD=1", RequireEnv+"="+tc.require)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.fails || !strings.Contains(string(out), tc.want) ||
			!strings.Contains(string(out), "no xfs here") {
			t.Errorf("%s=%q: err %v, output:\n%s\nwant %q", RequireEnv, tc.require, err, out, tc.want)
		}
	}
}
