package ch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// VmConfig is a CH VM configuration (the body of vm.create, the config of
// vm.info, the config.json of a snapshot) held as a JSON tree, so that keys
// this package does not know survive a read-modify-write. Numbers keep their
// exact text. The zero value is an empty config; use NewConfig for one CH
// accepts.
type VmConfig struct {
	root map[string]any
}

// Payload is what the guest boots from.
type Payload struct {
	Kernel    string
	Cmdline   string
	Initramfs string
	Firmware  string
}

// NewConfig returns a minimal config CH accepts for vm.create: the payload,
// boot and max vCPUs and the memory size in bytes.
func NewConfig(p Payload, vcpus int, memoryBytes int64) *VmConfig {
	c := &VmConfig{root: map[string]any{}}
	c.SetPayload(p)
	c.SetCPUs(vcpus, vcpus)
	c.SetMemorySize(memoryBytes)
	return c
}

// ParseConfig decodes a config. It must be a JSON object.
func ParseConfig(data []byte) (*VmConfig, error) {
	c := &VmConfig{}
	if err := c.UnmarshalJSON(data); err != nil {
		return nil, err
	}
	return c, nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *VmConfig) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("ch: config is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("ch: config has trailing data after the JSON object")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("ch: config must be a JSON object, got %T", v)
	}
	c.root = m
	return nil
}

// MarshalJSON implements json.Marshaler.
func (c *VmConfig) MarshalJSON() ([]byte, error) {
	if c == nil || c.root == nil {
		return []byte("{}"), nil
	}
	return json.Marshal(c.root)
}

// Clone returns a deep copy.
func (c *VmConfig) Clone() *VmConfig {
	if c == nil {
		return nil
	}
	return &VmConfig{root: deepCopy(c.root).(map[string]any)}
}

func deepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(t))
		for i, e := range t {
			s[i] = deepCopy(e)
		}
		return s
	default:
		return v
	}
}

// Get returns the value at path (object keys, or decimal indexes into
// arrays). Numbers come back as json.Number.
func (c *VmConfig) Get(path ...string) (any, bool) {
	var cur any = c.root
	for _, p := range path {
		switch t := cur.(type) {
		case map[string]any:
			v, ok := t[p]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(t) {
				return nil, false
			}
			cur = t[i]
		default:
			return nil, false
		}
	}
	return cur, cur != nil
}

// Set stores value at path, creating intermediate objects. Array elements
// must exist already. Integers are stored as json.Number.
func (c *VmConfig) Set(value any, path ...string) error {
	if len(path) == 0 {
		return errors.New("ch: Set needs a path")
	}
	if c.root == nil {
		c.root = map[string]any{}
	}
	value = normalize(value)
	var cur any = c.root
	for i, p := range path {
		last := i == len(path)-1
		switch t := cur.(type) {
		case map[string]any:
			if last {
				t[p] = value
				return nil
			}
			next, ok := t[p]
			if !ok || next == nil {
				next = map[string]any{}
				t[p] = next
			}
			cur = next
		case []any:
			idx, err := strconv.Atoi(p)
			if err != nil || idx < 0 || idx >= len(t) {
				return fmt.Errorf("ch: config path %v: no element %q", path[:i+1], p)
			}
			if last {
				t[idx] = value
				return nil
			}
			cur = t[idx]
		default:
			return fmt.Errorf("ch: config path %v: %T is not an object or array", path[:i], cur)
		}
	}
	return nil
}

func normalize(v any) any {
	switch t := v.(type) {
	case int:
		return json.Number(strconv.FormatInt(int64(t), 10))
	case int64:
		return json.Number(strconv.FormatInt(t, 10))
	case uint64:
		return json.Number(strconv.FormatUint(t, 10))
	default:
		return v
	}
}

func (c *VmConfig) getInt(path ...string) (int64, bool) {
	v, ok := c.Get(path...)
	if !ok {
		return 0, false
	}
	switch t := v.(type) {
	case json.Number:
		n, err := t.Int64()
		return n, err == nil
	case float64:
		return int64(t), true
	}
	return 0, false
}

func (c *VmConfig) getString(path ...string) string {
	v, _ := c.Get(path...)
	s, _ := v.(string)
	return s
}

func (c *VmConfig) getBool(path ...string) bool {
	v, _ := c.Get(path...)
	b, _ := v.(bool)
	return b
}

func (c *VmConfig) list(key string) []any {
	v, _ := c.Get(key)
	l, _ := v.([]any)
	return l
}

// SetPayload replaces the payload section.
func (c *VmConfig) SetPayload(p Payload) {
	m := map[string]any{}
	for k, v := range map[string]string{"kernel": p.Kernel, "cmdline": p.Cmdline, "initramfs": p.Initramfs, "firmware": p.Firmware} {
		if v != "" {
			m[k] = v
		}
	}
	_ = c.Set(m, "payload")
}

// MemorySize is memory.size in bytes (0 when absent).
func (c *VmConfig) MemorySize() int64 { n, _ := c.getInt("memory", "size"); return n }

// SetMemorySize sets memory.size in bytes.
func (c *VmConfig) SetMemorySize(n int64) { _ = c.Set(n, "memory", "size") }

// MemoryShared reports memory.shared; shared memory cannot be restored
// CopyOnWrite.
func (c *VmConfig) MemoryShared() bool { return c.getBool("memory", "shared") }

// MemoryHugepages reports memory.hugepages; hugepage memory cannot be
// restored CopyOnWrite.
func (c *VmConfig) MemoryHugepages() bool { return c.getBool("memory", "hugepages") }

// BalloonSize is balloon.size in bytes; ok is false without a balloon.
func (c *VmConfig) BalloonSize() (n int64, ok bool) { return c.getInt("balloon", "size") }

// SetBalloonSize sets balloon.size, adding a balloon device if there is none.
func (c *VmConfig) SetBalloonSize(n int64) { _ = c.Set(n, "balloon", "size") }

// CPUs returns cpus.boot_vcpus and cpus.max_vcpus.
func (c *VmConfig) CPUs() (boot, maxVcpus int) {
	b, _ := c.getInt("cpus", "boot_vcpus")
	m, _ := c.getInt("cpus", "max_vcpus")
	return int(b), int(m)
}

// SetCPUs sets cpus.boot_vcpus and cpus.max_vcpus.
func (c *VmConfig) SetCPUs(boot, maxVcpus int) {
	_ = c.Set(boot, "cpus", "boot_vcpus")
	_ = c.Set(maxVcpus, "cpus", "max_vcpus")
}

// DiskPaths lists disks[].path in order ("" for a disk without a path).
func (c *VmConfig) DiskPaths() []string {
	var out []string
	for i := range c.list("disks") {
		out = append(out, c.getString("disks", strconv.Itoa(i), "path"))
	}
	return out
}

// AddDisk appends a disk with the given path.
func (c *VmConfig) AddDisk(path string) {
	l := append(c.list("disks"), map[string]any{"path": path})
	_ = c.Set(l, "disks")
}

// SetDiskPath rewrites disks[i].path.
func (c *VmConfig) SetDiskPath(i int, path string) error {
	if i < 0 || i >= len(c.list("disks")) {
		return fmt.Errorf("ch: config has no disk %d", i)
	}
	return c.Set(path, "disks", strconv.Itoa(i), "path")
}

// NetTaps lists net[].tap in order.
func (c *VmConfig) NetTaps() []string {
	var out []string
	for i := range c.list("net") {
		out = append(out, c.getString("net", strconv.Itoa(i), "tap"))
	}
	return out
}

// NetIDs lists net[].id in order ("" where CH will assign one).
func (c *VmConfig) NetIDs() []string {
	var out []string
	for i := range c.list("net") {
		out = append(out, c.getString("net", strconv.Itoa(i), "id"))
	}
	return out
}

// SetNetTap rewrites net[i].tap.
func (c *VmConfig) SetNetTap(i int, tap string) error {
	if i < 0 || i >= len(c.list("net")) {
		return fmt.Errorf("ch: config has no net %d", i)
	}
	return c.Set(tap, "net", strconv.Itoa(i), "tap")
}

// VsockSocket is vsock.socket ("" without a vsock device).
func (c *VmConfig) VsockSocket() string { return c.getString("vsock", "socket") }

// VsockCID is vsock.cid (0 without a vsock device).
func (c *VmConfig) VsockCID() int64 { n, _ := c.getInt("vsock", "cid"); return n }

// SetVsock sets the vsock device's guest CID and host socket path.
func (c *VmConfig) SetVsock(cid int64, socket string) {
	_ = c.Set(cid, "vsock", "cid")
	_ = c.Set(socket, "vsock", "socket")
}

// SetVsockSocket rewrites vsock.socket of an existing vsock device.
func (c *VmConfig) SetVsockSocket(socket string) error {
	if _, ok := c.Get("vsock"); !ok {
		return errors.New("ch: config has no vsock device")
	}
	return c.Set(socket, "vsock", "socket")
}

// SerialFile is serial.file ("" unless the serial port writes to a file).
func (c *VmConfig) SerialFile() string { return c.getString("serial", "file") }

// SetSerialFile points the serial port at a file (mode File).
func (c *VmConfig) SetSerialFile(path string) {
	_ = c.Set("File", "serial", "mode")
	_ = c.Set(path, "serial", "file")
}

// ConsoleFile is console.file ("" unless the console writes to a file).
func (c *VmConfig) ConsoleFile() string { return c.getString("console", "file") }

// SetConsoleFile points the virtio console at a file (mode File).
func (c *VmConfig) SetConsoleFile(path string) {
	_ = c.Set("File", "console", "mode")
	_ = c.Set(path, "console", "file")
}
