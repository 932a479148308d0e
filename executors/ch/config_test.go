package ch_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// A config.json as CH writes it, with keys this package does not model.
const recordedConfig = `{
  "cpus": {"boot_vcpus": 2, "max_vcpus": 2, "topology": null, "kvm_hyperv": false, "max_phys_bits": 46, "affinity": null, "features": {"amx": false}},
  "memory": {"size": 1073741824, "mergeable": false, "hotplug_method": "Acpi", "shared": false, "hugepages": false, "thp": true, "zones": null},
  "payload": {"kernel": "/var/lib/sbx/vmlinux", "cmdline": "console=ttyS0 root=/dev/vda rw"},
  "disks": [{"path": "/run/sbx/vm-a/cow.raw", "readonly": false, "direct": false, "iommu": false, "num_queues": 1, "queue_size": 128, "id": "_disk0", "pci_segment": 0, "future_disk_knob": {"x": [1, 2]}}],
  "net": [{"tap": "sbxtap0", "ip": "192.168.249.1", "mask": "255.255.255.0", "mac": "12:34:56:78:90:ab", "num_queues": 2, "queue_size": 256, "id": "_net1"}],
  "rng": {"src": "/dev/urandom", "iommu": false},
  "balloon": {"size": 268435456, "deflate_on_oom": true, "free_page_reporting": true},
  "serial": {"file": "/run/sbx/vm-a/serial.log", "mode": "File", "iommu": false},
  "console": {"file": null, "mode": "Off", "iommu": false},
  "vsock": {"cid": 3, "socket": "/run/sbx/vm-a/vsock.sock", "iommu": false, "id": "_vsock2"},
  "iommu": false,
  "pvpanic": false,
  "huge_number": 18446744073709551615,
  "some_future_section": {"enabled": true}
}`

func TestConfigRewritePreservesUnknownKeys(t *testing.T) {
	c, err := ch.ParseConfig([]byte(recordedConfig))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.DiskPaths(); !reflect.DeepEqual(got, []string{"/run/sbx/vm-a/cow.raw"}) {
		t.Errorf("DiskPaths = %q", got)
	}
	if got := c.NetTaps(); !reflect.DeepEqual(got, []string{"sbxtap0"}) {
		t.Errorf("NetTaps = %q", got)
	}
	if got := c.NetIDs(); !reflect.DeepEqual(got, []string{"_net1"}) {
		t.Errorf("NetIDs = %q", got)
	}
	if c.VsockSocket() != "/run/sbx/vm-a/vsock.sock" || c.VsockCID() != 3 {
		t.Errorf("vsock = %q cid %d", c.VsockSocket(), c.VsockCID())
	}
	if c.SerialFile() != "/run/sbx/vm-a/serial.log" || c.ConsoleFile() != "" {
		t.Errorf("serial %q console %q", c.SerialFile(), c.ConsoleFile())
	}
	if c.MemorySize() != 1<<30 || c.MemoryShared() || c.MemoryHugepages() {
		t.Errorf("memory = %d shared %v huge %v", c.MemorySize(), c.MemoryShared(), c.MemoryHugepages())
	}
	if b, ok := c.BalloonSize(); !ok || b != 256<<20 {
		t.Errorf("balloon = %d, %v", b, ok)
	}
	if boot, maxV := c.CPUs(); boot != 2 || maxV != 2 {
		t.Errorf("cpus = %d/%d", boot, maxV)
	}

	// The clone recipe: every path moves into the new run dir.
	if err := c.SetDiskPath(0, "/run/sbx/vm-b/cow.raw"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetVsockSocket("/run/sbx/vm-b/vsock.sock"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetNetTap(0, "sbxtap7"); err != nil {
		t.Fatal(err)
	}
	c.SetSerialFile("/run/sbx/vm-b/serial.log")
	c.SetBalloonSize(128 << 20)
	if err := c.SetDiskPath(1, "/x"); err == nil {
		t.Error("SetDiskPath out of range accepted")
	}
	if err := c.SetNetTap(3, "x"); err == nil {
		t.Error("SetNetTap out of range accepted")
	}

	out, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var got, want map[string]any
	dec := json.NewDecoder(strings.NewReader(string(out)))
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	dec = json.NewDecoder(strings.NewReader(recordedConfig))
	dec.UseNumber()
	if err := dec.Decode(&want); err != nil {
		t.Fatal(err)
	}
	disk := want["disks"].([]any)[0].(map[string]any)
	disk["path"] = "/run/sbx/vm-b/cow.raw"
	want["vsock"].(map[string]any)["socket"] = "/run/sbx/vm-b/vsock.sock"
	want["net"].([]any)[0].(map[string]any)["tap"] = "sbxtap7"
	want["serial"].(map[string]any)["file"] = "/run/sbx/vm-b/serial.log"
	want["balloon"].(map[string]any)["size"] = json.Number("134217728")
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rewrite changed more than the paths:\n got %s", out)
	}
	if !strings.Contains(string(out), "18446744073709551615") {
		t.Error("a number beyond int64 lost its exact text")
	}
}

func TestConfigCloneIsDeep(t *testing.T) {
	c, err := ch.ParseConfig([]byte(recordedConfig))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Clone()
	if err := d.SetDiskPath(0, "/elsewhere"); err != nil {
		t.Fatal(err)
	}
	if c.DiskPaths()[0] != "/run/sbx/vm-a/cow.raw" {
		t.Fatal("Clone shares the disks array with the original")
	}
}

func TestConfigBuild(t *testing.T) {
	c := ch.NewConfig(ch.Payload{Kernel: "/k", Cmdline: "console=ttyS0"}, 2, 512<<20)
	c.AddDisk("/d0")
	c.AddDisk("/d1")
	c.SetVsock(7, "/v.sock")
	c.SetConsoleFile("/console.log")
	if err := c.Set(true, "memory", "thp"); err != nil {
		t.Fatal(err)
	}
	if v, ok := c.Get("memory", "thp"); !ok || v != true {
		t.Fatalf("Get(memory.thp) = %v, %v", v, ok)
	}
	if err := c.Set(1, "disks", "5", "x"); err == nil {
		t.Error("Set into a missing array element accepted")
	}
	if err := c.Set(1, "payload", "kernel", "deeper"); err == nil {
		t.Error("Set through a string accepted")
	}
	if err := c.Set(1); err == nil {
		t.Error("Set without a path accepted")
	}
	data, _ := json.Marshal(c)
	want := `{"console":{"file":"/console.log","mode":"File"},"cpus":{"boot_vcpus":2,"max_vcpus":2},"disks":[{"path":"/d0"},{"path":"/d1"}],"memory":{"size":536870912,"thp":true},"payload":{"cmdline":"console=ttyS0","kernel":"/k"},"vsock":{"cid":7,"socket":"/v.sock"}}`
	if string(data) != want {
		t.Fatalf("config = %s\nwant     %s", data, want)
	}
	var empty ch.VmConfig
	if err := empty.SetVsockSocket("/x"); err == nil {
		t.Error("SetVsockSocket without a vsock device accepted")
	}
	if data, _ := json.Marshal(&empty); string(data) != "{}" {
		t.Errorf("zero config = %s", data)
	}
}

func TestParseConfigRejects(t *testing.T) {
	for _, in := range []string{``, `[]`, `"x"`, `{"a":1} {"b":2}`, `{"a":`, `null`} {
		if _, err := ch.ParseConfig([]byte(in)); err == nil {
			t.Errorf("ParseConfig(%q) accepted", in)
		}
	}
}
