package ch_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// Tests for every known place where the real CH server differs from its
// OpenAPI description (listed in testdata/ch-api-subset.yaml and at specQuirk),
// run against chsim, and for how the client classifies each answer.

// bootedSim starts chsim and brings a VM to Running.
func bootedSim(t *testing.T) (dir string, c *ch.Client, cfg *ch.VmConfig) {
	t.Helper()
	dir = shortDir(t)
	p := startSim(t, dir)
	kernel, disk := guestFiles(t, dir)
	cfg = ch.NewConfig(ch.Payload{Kernel: kernel}, 1, 64<<20)
	cfg.AddDisk(disk)
	ctx := context.Background()
	if err := p.Client.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := p.Client.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	return dir, p.Client, cfg
}

func TestQuirkVMMShutdownAnswers200(t *testing.T) {
	dir := shortDir(t)
	p := startSim(t, dir)
	status, _, body := rawCall(t, p.Socket, http.MethodPut, "vmm.shutdown", "")
	if status != http.StatusOK || body != "" {
		t.Fatalf("vmm.shutdown = %d %q, want 200 with no body", status, body)
	}
	if err := p.WaitExit(5 * time.Second); err != nil {
		t.Fatal("VMM still running after vmm.shutdown")
	}
	// The socket file stays behind, like CH's; the client reads that as gone.
	if _, err := p.Client.Ping(context.Background()); !ch.IsVMMGone(err) {
		t.Fatalf("ping after exit = %v, want ErrVMMGone", err)
	}
}

func TestQuirkNever405(t *testing.T) {
	dir := shortDir(t)
	p := startSim(t, dir)
	cases := []struct {
		method, op, body string
		emptyBody        bool // CH's generic handler sends none for odd methods
	}{
		{http.MethodGet, "vm.pause", "", false},
		{http.MethodPost, "vm.pause", "", true},
		{http.MethodDelete, "vm.boot", "", true},
		{http.MethodPut, "vm.info", "", false},
		{http.MethodPost, "vm.info", "", false},
		{http.MethodGet, "vmm.shutdown", "", false},
		{http.MethodPut, "vmm.ping", "", false},
		{http.MethodPut, "vm.counters", "", false},
		{http.MethodPatch, "vm.counters", "", true},
		{http.MethodGet, "vm.snapshot", "", false},
		{http.MethodGet, "vm.create", "", false},
		// A body on a bodiless action, and no body where one is needed.
		{http.MethodPut, "vm.pause", `{"x":1}`, false},
		{http.MethodPut, "vm.shutdown", `{}`, false},
		{http.MethodPut, "vm.snapshot", "", false},
		{http.MethodPut, "vm.restore", "", false},
		{http.MethodPut, "vm.create", "", true},
	}
	for _, c := range cases {
		status, chain, body := rawCall(t, p.Socket, c.method, c.op, c.body)
		if status != http.StatusBadRequest {
			t.Errorf("%s %s: %d, want 400", c.method, c.op, status)
			continue
		}
		if c.emptyBody != (body == "") {
			t.Errorf("%s %s: body %q", c.method, c.op, body)
		}
		if !c.emptyBody && !slices.Equal(chain, []string{"Bad Request"}) {
			t.Errorf("%s %s: chain %q", c.method, c.op, chain)
		}
	}
	// Malformed JSON is 400 too, with serde's message.
	status, chain, _ := rawCall(t, p.Socket, http.MethodPut, "vm.restore", `{"memory_restore_mode":"Copy"}`)
	if status != http.StatusBadRequest || len(chain) != 2 || chain[0] != "Failed to deserialize JSON" || !strings.Contains(chain[1], "source_url") {
		t.Errorf("restore without source_url = %d %q", status, chain)
	}
	if status, chain, _ := rawCall(t, p.Socket, http.MethodGet, "vm.nosuch", ""); status != http.StatusNotFound || !slices.Equal(chain, []string{"Not Found"}) {
		t.Errorf("unknown endpoint = %d %q", status, chain)
	}
}

func TestQuirkWrongStateIs500(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	p := startSim(t, dir)
	c := p.Client

	expect500 := func(what string, err error, chainHas string) {
		t.Helper()
		var ae *ch.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusInternalServerError {
			t.Errorf("%s: %v, want a 500", what, err)
			return
		}
		if ae.Chain[0] != "Error from API" || !ae.Contains(chainHas) {
			t.Errorf("%s: chain %q lacks %q", what, ae.Chain, chainHas)
		}
	}
	// No VM at all.
	expect500("pause without VM", c.Pause(ctx), "VM is not running")
	expect500("resume without VM", c.Resume(ctx), "VM is not running")
	expect500("shutdown without VM", c.Shutdown(ctx), "VM is not running")
	for _, err := range []error{c.Pause(ctx), c.Resume(ctx), c.Shutdown(ctx)} {
		if !ch.IsInvalidState(err) {
			t.Errorf("IsInvalidState(%v) = false", err)
		}
	}

	// Created, not booted: still not running.
	kernel, disk := guestFiles(t, dir)
	cfg := ch.NewConfig(ch.Payload{Kernel: kernel}, 1, 64<<20)
	cfg.AddDisk(disk)
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	expect500("pause of a created VM", c.Pause(ctx), "VM is not running")
	expect500("create twice", c.Create(ctx, cfg), "VM is already created")

	// Running: a snapshot is refused, a second boot is a bad transition.
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap")
	if err := os.Mkdir(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	url, _ := ch.FileURL(snap)
	err := c.Snapshot(ctx, url)
	expect500("snapshot of a running VM", err, "Trying to snapshot while VM is running")
	if !ch.IsInvalidState(err) {
		t.Errorf("IsInvalidState(snapshot of running) = false")
	}
	expect500("boot twice", c.Boot(ctx), "invalid VM state transition: Running to Running")

	// Restore into a VMM that has a VM.
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Snapshot(ctx, url); err != nil {
		t.Fatal(err)
	}
	err = c.Restore(ctx, ch.RestoreConfig{SourceURL: url})
	expect500("restore into a VMM with a VM", err, "VM is already created")
	if !ch.IsConflict(err) {
		t.Errorf("IsConflict(restore into VMM with VM) = false")
	}
	// A second snapshot into the same dir: the files are created O_EXCL.
	expect500("snapshot over an existing one", c.Snapshot(ctx, url), "File exists (os error 17)")
	// A snapshot into a missing dir.
	missing, _ := ch.FileURL(filepath.Join(dir, "nope"))
	expect500("snapshot into a missing dir", c.Snapshot(ctx, missing), "No such file or directory (os error 2)")

	// After shutdown, pause and resume are "not running" again.
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	expect500("pause after shutdown", c.Pause(ctx), "VM is not running")
	info, err := c.Info(ctx)
	if err != nil || info.State != ch.StateShutdown {
		t.Fatalf("info after shutdown = %+v, %v", info, err)
	}
}

func TestQuirkErrorBodyIsChainAndPausePausedIsSuccess(t *testing.T) {
	ctx := context.Background()
	_, c, _ := bootedSim(t)
	sock := c.SocketPath()
	if status, _, _ := rawCall(t, sock, http.MethodPut, "vm.pause", ""); status != http.StatusNoContent {
		t.Fatalf("first pause = %d", status)
	}
	status, chain, _ := rawCall(t, sock, http.MethodPut, "vm.pause", "")
	want := []string{"Error from API", "The VM could not be paused", "Cannot pause VM",
		"Failed to pause migratable component", "Invalid transition: InvalidStateTransition(Paused, Paused)"}
	if status != http.StatusInternalServerError || !slices.Equal(chain, want) {
		t.Fatalf("pause of paused VM = %d %q", status, chain)
	}
	if err := c.Pause(ctx); err != nil {
		t.Fatalf("client Pause of a paused VM = %v, want success", err)
	}
	if err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	status, chain, _ = rawCall(t, sock, http.MethodPut, "vm.resume", "")
	if status != http.StatusInternalServerError || !strings.Contains(strings.Join(chain, "|"), "InvalidStateTransition(Running, Running)") {
		t.Fatalf("resume of running VM = %d %q", status, chain)
	}
	if err := c.Resume(ctx); err != nil {
		t.Fatalf("client Resume of a running VM = %v, want success", err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.State != ch.StateRunning {
		t.Fatalf("state = %+v, %v", info, err)
	}
}

func TestQuirk404And409(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	p := startSim(t, dir)
	c := p.Client

	if _, err := c.Info(ctx); !ch.IsNotFound(err) {
		t.Errorf("info before create = %v, want 404", err)
	}
	if err := c.Boot(ctx); !ch.IsNotFound(err) {
		t.Errorf("boot before create = %v, want 404", err)
	}
	if err := c.RemoveDevice(ctx, "_net0"); !ch.IsNotFound(err) {
		t.Errorf("remove-device before create = %v, want 404", err)
	}

	kernel, disk := guestFiles(t, dir)
	cfg := ch.NewConfig(ch.Payload{Kernel: kernel}, 1, 64<<20)
	cfg.AddDisk(disk)
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Cold add (not booted): 204 and no PCI info.
	pci, err := c.AddNet(ctx, ch.NetConfig{Tap: "sbxtap1", ID: "net1"})
	if err != nil || pci != nil {
		t.Fatalf("cold add-net = %+v, %v", pci, err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	status, chain, _ := rawCall(t, p.Socket, http.MethodPut, "vm.add-net", `{"tap":"sbxtap2","id":"net1"}`)
	if status != http.StatusConflict || len(chain) < 3 || !strings.Contains(chain[len(chain)-1], "net1") {
		t.Errorf("duplicate net id = %d %q, want 409", status, chain)
	}
	if _, err := c.AddNet(ctx, ch.NetConfig{Tap: "sbxtap2", ID: "_disk0"}); !ch.IsConflict(err) {
		t.Errorf("net with a disk's id = %v, want 409", err)
	}
	status, chain, _ = rawCall(t, p.Socket, http.MethodPut, "vm.remove-device", `{"id":"nosuch"}`)
	if status != http.StatusNotFound || !strings.Contains(chain[len(chain)-1], `"nosuch"`) {
		t.Errorf("unknown device id = %d %q, want 404", status, chain)
	}
	// The NIC swap after a clone: remove by id, add the new tap.
	if err := c.RemoveDevice(ctx, "net1"); err != nil {
		t.Fatal(err)
	}
	pci, err = c.AddNet(ctx, ch.NetConfig{Tap: "sbxtap3"})
	if err != nil || pci == nil || pci.ID == "" || pci.BDF == "" {
		t.Fatalf("hot add-net = %+v, %v", pci, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if taps := info.Config.NetTaps(); !slices.Equal(taps, []string{"sbxtap3"}) {
		t.Errorf("taps after swap = %q", taps)
	}
}
