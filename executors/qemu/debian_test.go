package qemu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/fsm"
)

// The Debian template (executors/guest/template.sh) under TCG, through the
// driver as the daemon runs it: a golden build, clones of it, the userland a
// sandbox promises (python3, git, bash, Debian), its SSH server's banner
// through port_forward to 22, and the disk: a file written in one clone
// survives its hibernate and wake and is not in another clone of the same
// golden. The store is a plain directory: on a filesystem without reflinks
// a clone copies the RAM file and the disk overlay, not the image.
func TestDebianTemplateWithQEMU(t *testing.T) {
	g := guesttest.RequireDebian(t)
	root, err := os.MkdirTemp("", "qdeb") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	killQEMUsOnCleanup(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	d := newDriver(t, root, func(c *Config) {
		c.Templates = map[string]Guest{TemplateDefault: {Kernel: g.Kernel, Initrd: g.Initrd, Disk: g.Disk}}
		c.StopGrace = 3 * time.Second
	})
	if _, err := d.Prepare(ctx); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	gres, err := d.BuildGolden(ctx, fsm.BuildGolden{OpID: newOp(), Key: testKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("golden build (cold boot to agent ready, snapshot): %v, steps %v", time.Since(start), gres.Report.Steps)
	m, err := checkSnapshot(filepath.Join(d.roots.Store, gres.SnapshotDir))
	if err != nil || !m.Disk || m.Append != RootAppend {
		t.Fatalf("golden meta %+v, %v; want a disk and %q", m, err, RootAppend)
	}
	// The golden's disk is an overlay: what the boot wrote, not the image.
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(d.roots.Store, gres.SnapshotDir, FileDisk), &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("golden disk overlay: %d KiB allocated", st.Blocks/2)
	if base, err := qcow2Backing(filepath.Join(d.roots.Store, gres.SnapshotDir, FileDisk)); err != nil || base != filepath.Join(filepath.Dir(g.Disk), "rootfs.img") {
		t.Fatalf("golden disk's backing file %q, %v", base, err)
	}

	clone := func(vm string) string {
		t.Helper()
		run := testInstance + "/" + vm
		start := time.Now()
		res, err := d.Clone(ctx, fsm.CloneVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: run, GoldenDir: gres.SnapshotDir})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("clone %s: %v (%s), steps %v", vm, time.Since(start), res.Report.CopyMode, res.Report.Steps)
		t.Cleanup(func() {
			_, _ = d.Destroy(context.Background(), fsm.DestroyVM{OpID: newOp(), VM: vm, Key: testKey, Instance: testInstance, RunDir: run})
		})
		return run
	}
	conn := func(run string) *silkd.Conn {
		t.Helper()
		c, err := d.DialAgent(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return silkd.NewConn(c)
	}
	// run execs argv in the VM and returns its stdout and exit code.
	run := func(vm string, argv ...string) (string, int) {
		t.Helper()
		var out, errb bytes.Buffer
		res, err := conn(vm).Exec(ctx, silkd.Exec{Argv: argv}, silkd.ExecIO{Stdout: &out, Stderr: &errb})
		if err != nil {
			t.Fatalf("exec %q: %v", argv, err)
		}
		if res.Code != 0 && errb.Len() > 0 {
			t.Logf("exec %q: exit %d, stderr %q", argv, res.Code, errb.String())
		}
		return out.String(), int(res.Code)
	}

	a := clone("vm-00000000000000d1")
	for _, tc := range []struct {
		argv []string
		want func(string) bool
	}{
		{[]string{"python3", "-c", "print(6*7)"}, func(s string) bool { return s == "42\n" }},
		{[]string{"git", "--version"}, func(s string) bool { return strings.HasPrefix(s, "git version ") }},
		{[]string{"bash", "-c", `echo "bash ${BASH_VERSINFO[0]}"; [[ -d /usr ]] && echo ok`}, func(s string) bool {
			return strings.HasPrefix(s, "bash 5") && strings.HasSuffix(s, "\nok\n")
		}},
		{[]string{"cat", "/etc/os-release"}, func(s string) bool { return strings.Contains(s, "ID=debian") }},
		{[]string{"ls", "/etc/ssl/certs/ca-certificates.crt"}, func(s string) bool { return s != "" }},
		{[]string{"hostname"}, func(s string) bool { return s == "sandbox\n" }},
	} {
		if out, code := run(a, tc.argv...); code != 0 || !tc.want(out) {
			t.Errorf("%q: exit %d, stdout %q", tc.argv, code, out)
		}
	}

	// The SSH server speaks first: its banner, through port_forward to 22.
	var p *silkd.PortConn
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err = conn(a).PortForward(ctx, 22)
		if err == nil || !errors.Is(err, silkd.ErrNotFound) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // dropbear is not listening yet
	}
	if err != nil {
		t.Fatal(err)
	}
	banner, err := bufio.NewReader(p).ReadString('\n')
	p.Close()
	if err != nil || !strings.HasPrefix(banner, "SSH-2.0-") {
		t.Fatalf("port 22 said %q, %v; want an SSH-2.0- banner", banner, err)
	}
	t.Logf("port 22: %q", strings.TrimSpace(banner))

	// The disk travels through a hibernate and a wake.
	if _, code := run(a, "sh", "-c", "echo kept >/root/marker && sync"); code != 0 {
		t.Fatal("writing /root/marker failed")
	}
	vmA := filepath.Base(a)
	start = time.Now()
	hres, err := d.Hibernate(ctx, fsm.HibernateVM{OpID: newOp(), Claim: "sb_d1", VM: vmA, Key: testKey, RunDir: a})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.DialAgent(ctx, a); !errors.Is(err, executors.ErrAgentUnreachable) {
		t.Fatalf("DialAgent of a hibernated VM = %v", err)
	}
	wres, err := d.Wake(ctx, fsm.WakeVM{OpID: newOp(), Claim: "sb_d1", VM: vmA, Key: testKey, RunDir: a, SnapshotDir: hres.SnapshotDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hibernate and wake: %v (wake steps %v)", time.Since(start), wres.Report.Steps)
	if out, code := run(a, "cat", "/root/marker"); code != 0 || out != "kept\n" {
		t.Fatalf("after wake /root/marker: exit %d, %q", code, out)
	}

	// Another clone of the golden has a disk of its own.
	b := clone("vm-00000000000000d2")
	if out, code := run(b, "sh", "-c", "test -e /root/marker && echo present || echo absent"); code != 0 || out != "absent\n" {
		t.Fatalf("a second clone sees %q (exit %d) for the first clone's file", out, code)
	}
}
