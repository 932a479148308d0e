package chsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// vmInstance is the VM a VMM holds between vm.create (or vm.restore) and
// vm.delete. Its runtime (memory, devices, guest) exists while it is booted:
// Running or Paused.
type vmInstance struct {
	cfg   *ch.VmConfig
	state ch.VmState

	mem  *guestMemory
	devs *devices

	memSize       int64
	balloonTarget int64
	balloonActual int64
	balloonAt     time.Time

	agentReadyAt time.Time
	heartbeats   int64
	resumes      int64
	bootID       uint64

	// clock is the guest's wall clock, clockSet the host's last set of it
	// (clock.go).
	clock    guestClock
	clockSet clockSet

	guestStop chan struct{}
	// guest is the simulated guest's files and agent (guest.go), new at
	// every boot, restored from the snapshot by vm.restore.
	guest *simGuest
}

func (v *vmInstance) booted() bool {
	return v.state == ch.StateRunning || v.state == ch.StatePaused
}

// advanceLocked moves time-driven state (the balloon) forward. Only a
// running guest's balloon driver makes progress.
func (s *Server) advanceLocked() {
	v := s.vm
	if v == nil {
		return
	}
	now := s.now()
	if v.state == ch.StateRunning && v.balloonActual != v.balloonTarget {
		if s.opts.BalloonRate == 0 {
			v.balloonActual = v.balloonTarget
		} else {
			step := int64(float64(s.opts.BalloonRate) * now.Sub(v.balloonAt).Seconds())
			if v.balloonActual < v.balloonTarget {
				v.balloonActual = min(v.balloonTarget, v.balloonActual+step)
			} else {
				v.balloonActual = max(v.balloonTarget, v.balloonActual-step)
			}
		}
	}
	v.balloonAt = now
}

// teardownLocked drops the VM's runtime (guest, memory, devices); the VM
// itself stays unless the caller clears s.vm.
func (s *Server) teardownLocked() {
	v := s.vm
	if v == nil {
		return
	}
	if v.guestStop != nil {
		close(v.guestStop)
		v.guestStop = nil
	}
	if v.devs != nil {
		v.devs.close()
		v.devs = nil
	}
	if v.mem != nil {
		v.mem.close()
		v.mem = nil
	}
}

// runGuest is the simulated guest: while the VM runs it writes a heartbeat
// into its memory and reads one data page per tick, so a private mapping
// really gets copy-on-write pages and a truncated memory file really faults.
func (s *Server) runGuest(v *vmInstance, stop chan struct{}) {
	tick := s.opts.GuestTick
	if tick <= 0 {
		tick = DefaultGuestTick
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		select {
		case <-stop:
			s.mu.Unlock()
			return
		default:
		}
		s.advanceLocked()
		if v.state == ch.StateRunning && v.mem != nil && v.mem.expect != nil {
			// The resumed guest's first touch of its whole working set.
			want := *v.mem.expect
			v.mem.expect = nil
			if sum := v.mem.checksum(); sum != want {
				s.mu.Unlock()
				s.guestCrash(fmt.Sprintf("guest memory differs from the snapshot (crc32c %08x, want %08x)", sum, want))
				return
			}
		}
		if v.state == ch.StateRunning && v.mem != nil {
			v.heartbeats++
			v.mem.heartbeat(v.heartbeats)
			v.mem.touchNext()
		}
		s.mu.Unlock()
	}
}

// guestCrash ends the VMM the way a guest that crashes and powers off ends
// CH: the VMM process exits.
func (s *Server) guestCrash(reason string) {
	s.log.Printf("guest crashed: %s; VMM exiting", reason)
	s.quitOnce.Do(func() { close(s.quit) })
}

func (s *Server) startGuestLocked(v *vmInstance) {
	v.guestStop = make(chan struct{})
	go s.runGuest(v, v.guestStop)
}

func (s *Server) info(_ []byte) (any, *apiError) {
	v := s.vm
	if v == nil {
		return nil, vmmErr(http.StatusNotFound, "The VM info is not available", "VM is not created")
	}
	tree := map[string]any{}
	slot := 2
	for _, id := range s.deviceIDs(v.cfg) {
		tree[id] = map[string]any{"id": id, "resources": []any{}, "children": []string{}, "pci_bdf": fmt.Sprintf("0000:00:%02x.0", slot)}
		slot++
	}
	return map[string]any{
		"config":             v.cfg,
		"state":              v.state,
		"memory_actual_size": v.memSize - v.balloonActual,
		"device_tree":        tree,
	}, nil
}

func (s *Server) counters(_ []byte) (any, *apiError) {
	v := s.vm
	if v == nil || !v.booted() {
		return nil, vmmErr(http.StatusInternalServerError, "The VM info is not available", "VM is not running")
	}
	out := map[string]map[string]int64{}
	for _, id := range s.deviceIDs(v.cfg) {
		switch {
		case strings.HasPrefix(id, "_disk"):
			out[id] = map[string]int64{"read_bytes": 0, "read_ops": 0, "write_bytes": 0, "write_ops": 0}
		case strings.HasPrefix(id, "_net"):
			out[id] = map[string]int64{"rx_bytes": 0, "rx_frames": 0, "tx_bytes": 0, "tx_frames": 0}
		}
	}
	var dirty int64
	if v.mem != nil {
		dirty = v.mem.dataBytes()
	}
	// Not a CH device: what the simulated guest did, for tests.
	// clock_sets counts the host's sets of the guest's clock since this
	// VMM booted or restored it, clock_told_ns is the time the last one
	// gave and clock_was_ns the guest's clock it replaced (Unix ns).
	out["chsim-guest"] = map[string]int64{
		"heartbeats": v.heartbeats, "resumes": v.resumes, "data_bytes": dirty,
		"clock_sets": v.clockSet.n, "clock_told_ns": unixNano(v.clockSet.to), "clock_was_ns": unixNano(v.clockSet.was),
	}
	return out, nil
}

// deviceIDs lists the ids of the config's disks, nets and vsock in order.
func (s *Server) deviceIDs(cfg *ch.VmConfig) []string {
	var ids []string
	for _, key := range []string{"disks", "net"} {
		l, _ := cfg.Get(key)
		items, _ := l.([]any)
		for i := range items {
			if id, _ := cfg.Get(key, strconv.Itoa(i), "id"); id != nil {
				ids = append(ids, id.(string))
			}
		}
	}
	if id, ok := cfg.Get("vsock", "id"); ok {
		ids = append(ids, id.(string))
	}
	return ids
}

// assignIDs gives every disk, net and vsock without an id one, from the
// counter CH shares between device kinds.
func (s *Server) assignIDs(cfg *ch.VmConfig) {
	for _, id := range s.deviceIDs(cfg) {
		if i := strings.LastIndexFunc(id, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			if n, err := strconv.Atoi(id[i+1:]); err == nil && n >= s.ids {
				s.ids = n + 1
			}
		}
	}
	for _, pair := range [][2]string{{"disks", "_disk"}, {"net", "_net"}} {
		l, _ := cfg.Get(pair[0])
		items, _ := l.([]any)
		for i := range items {
			if _, ok := cfg.Get(pair[0], strconv.Itoa(i), "id"); !ok {
				_ = cfg.Set(fmt.Sprintf("%s%d", pair[1], s.ids), pair[0], strconv.Itoa(i), "id")
				s.ids++
			}
		}
	}
	if _, ok := cfg.Get("vsock"); ok {
		if _, ok := cfg.Get("vsock", "id"); !ok {
			_ = cfg.Set(fmt.Sprintf("_vsock%d", s.ids), "vsock", "id")
			s.ids++
		}
	}
}

func (s *Server) create(body []byte) (any, *apiError) {
	if len(body) == 0 {
		return nil, errBadMethodNoBody
	}
	cfg, err := ch.ParseConfig(body)
	if err != nil {
		return nil, deserializeErr(err.Error())
	}
	if s.vm != nil {
		return nil, vmmErr(http.StatusInternalServerError, "The VM could not be created", "VM is already created")
	}
	if e := validateConfig(cfg, "The VM could not be created"); e != nil {
		return nil, e
	}
	s.assignIDs(cfg)
	s.vm = newInstance(cfg, ch.StateCreated, s.now())
	return nil, nil
}

func newInstance(cfg *ch.VmConfig, state ch.VmState, now time.Time) *vmInstance {
	mem := cfg.MemorySize()
	if mem <= 0 {
		mem = DefaultMemorySize
	}
	target, _ := cfg.BalloonSize()
	return &vmInstance{cfg: cfg, state: state, memSize: mem, balloonTarget: target, balloonAt: now}
}

func validateConfig(cfg *ch.VmConfig, action string) *apiError {
	fail := func(msg string) *apiError {
		return vmmErr(http.StatusInternalServerError, action, "Failed to validate config", msg)
	}
	if _, ok := cfg.Get("payload"); !ok {
		return deserializeErr("missing field `payload`")
	}
	p, _ := cfg.Get("payload", "kernel")
	f, _ := cfg.Get("payload", "firmware")
	if p == nil && f == nil {
		return fail("No kernel specified")
	}
	if n, ok := cfg.Get("memory", "size"); ok {
		if _, isNum := n.(json.Number); !isNum || cfg.MemorySize() <= 0 {
			return fail("Memory size must be a positive number of bytes")
		}
	}
	if boot, maxV := cfg.CPUs(); boot > 0 && maxV > 0 && boot > maxV {
		return fail("Max vCPUs lower than boot vCPUs")
	}
	memSize := cfg.MemorySize()
	if memSize == 0 {
		memSize = DefaultMemorySize
	}
	if bs, ok := cfg.BalloonSize(); ok && (bs < 0 || bs >= memSize) {
		return fail("Balloon size must be smaller than memory size")
	}
	if _, ok := cfg.Get("vsock"); ok {
		if cfg.VsockCID() < 3 {
			return fail("Vsock CID must be 3 or more")
		}
		if cfg.VsockSocket() == "" {
			return fail("Vsock socket path missing")
		}
	}
	return nil
}

func (s *Server) boot(_ []byte) (any, *apiError) {
	const action = "The VM could not boot"
	v := s.vm
	if v == nil {
		return nil, vmmErr(http.StatusNotFound, action, "VM config is missing")
	}
	switch v.state {
	case ch.StateRunning:
		return nil, vmmErr(http.StatusInternalServerError, action, "invalid VM state transition: Running to Running")
	case ch.StatePaused:
		// CH boots a paused VM by resuming it.
		return s.resume(nil)
	}
	for _, k := range []string{"kernel", "firmware"} {
		if p, _ := v.cfg.Get("payload", k); p != nil {
			f, err := os.Open(p.(string))
			if err != nil {
				return nil, vmmErr(http.StatusInternalServerError, action, "Cannot open kernel file", osErrText(err))
			}
			f.Close()
			break
		}
	}
	devs, e := s.openDevices(v.cfg, action)
	if e != nil {
		return nil, e
	}
	mem, err := newAnonMemory(v.memSize)
	if err != nil {
		devs.close()
		return nil, vmmErr(http.StatusInternalServerError, action, "Error from memory manager", osErrText(err))
	}
	now := s.now()
	v.bootID = uint64(now.UnixNano())
	mem.fillBoot(min(s.opts.DirtyBytes, v.memSize), v.bootID)
	v.mem, v.devs = mem, devs
	v.state = ch.StateRunning
	v.balloonActual, v.balloonAt = 0, now
	v.agentReadyAt = now.Add(s.opts.AgentDelay)
	v.clock = guestClock{}
	v.guest = s.newSimGuest(v, nil)
	devs.writeConsole(fmt.Sprintf("[    0.000000] Linux version 6.1.0-chsim (simulated guest, boot id %x)\n", v.bootID))
	s.startGuestLocked(v)
	return nil, nil
}

func (s *Server) shutdown(_ []byte) (any, *apiError) {
	v := s.vm
	if v == nil || !v.booted() {
		return nil, vmmErr(http.StatusInternalServerError, "The VM could not shutdown", "VM is not running")
	}
	s.teardownLocked()
	v.state = ch.StateShutdown
	return nil, nil
}

func (s *Server) delete(_ []byte) (any, *apiError) {
	if s.vm == nil {
		return nil, nil
	}
	s.teardownLocked()
	s.vm = nil
	return nil, nil
}

func (s *Server) reboot(_ []byte) (any, *apiError) {
	v := s.vm
	if v == nil || v.state != ch.StateRunning {
		return nil, vmmErr(http.StatusInternalServerError, "The VM could not reboot", "VM is not running")
	}
	v.agentReadyAt = s.now().Add(s.opts.AgentDelay)
	v.clock = guestClock{}          // the rebooted guest reads its RTC again
	v.guest = s.newSimGuest(v, nil) // a reboot empties the guest's tmpfs
	return nil, nil
}

func (s *Server) powerButton(_ []byte) (any, *apiError) {
	v := s.vm
	if v == nil || v.state != ch.StateRunning {
		return nil, vmmErr(http.StatusInternalServerError, "Error triggering power button", "VM is not running")
	}
	// The guest answers ACPI power-off by shutting down.
	s.teardownLocked()
	v.state = ch.StateShutdown
	return nil, nil
}

func (s *Server) pause(_ []byte) (any, *apiError) {
	const action = "The VM could not be paused"
	v := s.vm
	if v == nil || !v.booted() {
		return nil, vmmErr(http.StatusInternalServerError, action, "VM is not running")
	}
	if v.state == ch.StatePaused {
		return nil, vmmErr(http.StatusInternalServerError, action, "Cannot pause VM",
			"Failed to pause migratable component", "Invalid transition: InvalidStateTransition(Paused, Paused)")
	}
	v.state = ch.StatePaused
	v.clock.pause(s.now())
	return nil, nil
}

func (s *Server) resume(_ []byte) (any, *apiError) {
	const action = "The VM could not resume"
	v := s.vm
	if v == nil || !v.booted() {
		return nil, vmmErr(http.StatusInternalServerError, action, "VM is not running")
	}
	if v.state == ch.StateRunning {
		// CH wraps this one in a pause error; kept as the server sends it.
		return nil, vmmErr(http.StatusInternalServerError, action, "Cannot resume VM",
			"Failed to pause migratable component", "Invalid transition: InvalidStateTransition(Running, Running)")
	}
	v.state = ch.StateRunning
	v.resumes++
	v.balloonAt = s.now()
	v.clock.resume(v.balloonAt)
	return nil, nil
}

func (s *Server) addNet(body []byte) (any, *apiError) {
	const action = "The network device could not be added to the VM"
	var fields map[string]any
	if e := decodeBody(body, &fields); e != nil {
		return nil, e
	}
	var nc ch.NetConfig
	if e := decodeBody(body, &nc); e != nil {
		return nil, e
	}
	v := s.vm
	if v == nil {
		return nil, vmmErr(http.StatusNotFound, action, "VM is not created")
	}
	if nc.ID != "" && slices.Contains(s.deviceIDs(v.cfg), nc.ID) {
		return nil, vmmErr(http.StatusConflict, action, "Error from device manager", fmt.Sprintf("Identifier %s is not unique", nc.ID))
	}
	if nc.ID == "" {
		nc.ID = fmt.Sprintf("_net%d", s.ids)
		s.ids++
	}
	fields["id"] = nc.ID
	l, _ := v.cfg.Get("net")
	items, _ := l.([]any)
	_ = v.cfg.Set(append(items, fields), "net")
	if !v.booted() {
		return nil, nil // cold add: 204
	}
	ids := s.deviceIDs(v.cfg)
	return map[string]string{"id": nc.ID, "bdf": fmt.Sprintf("0000:00:%02x.0", 1+len(ids))}, nil
}

func (s *Server) removeDevice(body []byte) (any, *apiError) {
	const action = "The device could not be removed from the VM"
	var req struct {
		ID string `json:"id"`
	}
	if e := decodeBody(body, &req, "id"); e != nil {
		return nil, e
	}
	v := s.vm
	if v == nil {
		return nil, vmmErr(http.StatusNotFound, action, "VM is not created")
	}
	for _, key := range []string{"net", "disks"} {
		l, _ := v.cfg.Get(key)
		items, _ := l.([]any)
		for i, it := range items {
			if m, _ := it.(map[string]any); m != nil && m["id"] == req.ID {
				_ = v.cfg.Set(slices.Delete(items, i, i+1), key)
				if v.devs != nil {
					v.devs.closeDisk(req.ID)
				}
				return nil, nil
			}
		}
	}
	return nil, vmmErr(http.StatusNotFound, action, fmt.Sprintf("No device with id %q to remove", req.ID))
}

func (s *Server) resize(body []byte) (any, *apiError) {
	const action = "The VM could not be resized"
	var req ch.Resize
	if e := decodeBody(body, &req); e != nil {
		return nil, e
	}
	v := s.vm
	if v == nil {
		return nil, vmmErr(http.StatusNotFound, action, "VM is not created")
	}
	if req.DesiredVcpus != nil {
		_, maxV := v.cfg.CPUs()
		if maxV == 0 {
			maxV = 1
		}
		if *req.DesiredVcpus < 1 || *req.DesiredVcpus > maxV {
			return nil, vmmErr(http.StatusInternalServerError, action, "Error from CPU manager",
				fmt.Sprintf("Desired vCPUs %d outside 1..%d", *req.DesiredVcpus, maxV))
		}
	}
	if req.DesiredRAM != nil && *req.DesiredRAM != v.memSize {
		return nil, vmmErr(http.StatusInternalServerError, action, "Error from memory manager", "chsim does not simulate memory hotplug")
	}
	if req.DesiredBalloon != nil {
		if _, ok := v.cfg.BalloonSize(); !ok {
			return nil, vmmErr(http.StatusInternalServerError, action, "Error from memory manager", "No balloon device present")
		}
		if *req.DesiredBalloon < 0 || *req.DesiredBalloon >= v.memSize {
			return nil, vmmErr(http.StatusInternalServerError, action, "Error from memory manager", "Balloon size must be smaller than memory size")
		}
	}
	if req.DesiredVcpus != nil {
		_ = v.cfg.Set(*req.DesiredVcpus, "cpus", "boot_vcpus")
	}
	if req.DesiredBalloon != nil {
		v.balloonTarget = *req.DesiredBalloon
		v.cfg.SetBalloonSize(*req.DesiredBalloon)
	}
	return nil, nil
}

// addDisk is vm.add-disk: the disk is opened (and locked) as CH opens it,
// added to the config, and, in a booted VM, hot-plugged (its file kept open
// until remove-device or the VM's end). A duplicate id or path is 409.
func (s *Server) addDisk(body []byte) (any, *apiError) {
	const action = "The disk could not be added to the VM"
	var fields map[string]any
	if e := decodeBody(body, &fields); e != nil {
		return nil, e
	}
	var dc ch.DiskConfig
	if e := decodeBody(body, &dc); e != nil {
		return nil, e
	}
	v := s.vm
	if v == nil {
		return nil, vmmErr(http.StatusNotFound, action, "VM is not created")
	}
	if dc.Path == "" {
		return nil, vmmErr(http.StatusBadRequest, action, "Disk path missing")
	}
	if dc.ID != "" && slices.Contains(s.deviceIDs(v.cfg), dc.ID) {
		return nil, vmmErr(http.StatusConflict, action, "Error from device manager", fmt.Sprintf("Identifier %s is not unique", dc.ID))
	}
	if slices.Contains(v.cfg.DiskPaths(), dc.Path) {
		return nil, vmmErr(http.StatusConflict, action, "Error from device manager", fmt.Sprintf("Disk path %s is already in use", dc.Path))
	}
	if dc.ID == "" {
		dc.ID = fmt.Sprintf("_disk%d", s.ids)
		s.ids++
	}
	fields["id"] = dc.ID
	if v.booted() && v.devs != nil {
		f, causes := openDisk(dc.Path, dc.Readonly)
		if causes != nil {
			return nil, vmmErr(http.StatusInternalServerError, action, causes...)
		}
		v.devs.disks[dc.ID] = f
	}
	l, _ := v.cfg.Get("disks")
	items, _ := l.([]any)
	_ = v.cfg.Set(append(items, fields), "disks")
	if !v.booted() {
		return nil, nil // cold add: 204
	}
	ids := s.deviceIDs(v.cfg)
	return map[string]string{"id": dc.ID, "bdf": fmt.Sprintf("0000:00:%02x.0", 1+len(ids))}, nil
}
