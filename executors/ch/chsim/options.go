package chsim

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Environment variables read by ParseEnv. They exist because a VMM is
// launched with nothing but --api-socket, so the environment is the only way
// a test or benchmark can shape one instance's behaviour.
const (
	EnvLatency           = "SBX_CHSIM_LATENCY"             // duration added to every API call, e.g. "2ms"
	EnvOpLatency         = "SBX_CHSIM_OP_LATENCY"          // "<op>:<duration>[,...]": added to one endpoint's calls, e.g. "vm.snapshot:500ms"
	EnvFail              = "SBX_CHSIM_FAIL"                // "<op>:<n>[+]:<status|exit|hang>[,...]"
	EnvSnapshotExitAfter = "SBX_CHSIM_SNAPSHOT_EXIT_AFTER" // bytes: die (SIGKILL) mid-snapshot after writing this many
	EnvExitRandom        = "SBX_CHSIM_EXIT_RANDOM"         // duration: die (SIGKILL) at a uniformly random time within it
	EnvDirtyBytes        = "SBX_CHSIM_DIRTY_BYTES"         // size of the data a booted guest writes into its memory
	EnvBalloonRate       = "SBX_CHSIM_BALLOON_RATE"        // balloon inflation speed, bytes per second (0 = instant)
	EnvAgentDelay        = "SBX_CHSIM_AGENT_DELAY"         // time after boot before the guest answers vsock CONNECTs
	EnvVsockPorts        = "SBX_CHSIM_VSOCK_PORTS"         // comma-separated guest ports that accept (default: all)
	EnvIgnoreSIGTERM     = "SBX_CHSIM_IGNORE_SIGTERM"      // "1": a wedged VMM that only SIGKILL stops
	EnvGuestTick         = "SBX_CHSIM_GUEST_TICK"          // how often a running guest writes its heartbeat
	EnvGuestFSBytes      = "SBX_CHSIM_GUEST_FS_BYTES"      // bound of each VM's simulated tmpfs
	EnvNoClockVerb       = "SBX_CHSIM_NO_CLOCK_VERB"       // "1": the guest's control agent predates the clock verb
)

// Defaults.
const (
	DefaultDirtyBytes  = 4 << 20
	DefaultBalloonRate = 256 << 20
	// DefaultGuestTick keeps an idle simulated guest nearly as quiet as an
	// idle real one: hundreds of VMs on a host must not busy its CPUs.
	DefaultGuestTick = 100 * time.Millisecond
	// DefaultMemorySize is CH's memory size when a config names none.
	DefaultMemorySize = 512 << 20
	// DefaultGuestFSBytes bounds a VM's simulated tmpfs, which lives in
	// the simulator's (the host's) memory.
	DefaultGuestFSBytes = 256 << 20
)

// FailAction says what an injected failure does.
type FailAction int

// Fail actions.
const (
	// FailStatus answers with the rule's status and an error chain.
	FailStatus FailAction = iota
	// FailExit kills the process (SIGKILL) instead of answering.
	FailExit
	// FailHang never answers; the connection stays open until the client
	// gives up.
	FailHang
)

// FailRule fails the N-th call (1-based) of one endpoint, or every call from
// the N-th on when From is set.
type FailRule struct {
	Op     string // endpoint, e.g. "vm.pause"
	N      int
	From   bool
	Action FailAction
	Status int // for FailStatus
}

func (r FailRule) matches(op string, n int) bool {
	if r.Op != op {
		return false
	}
	if r.From {
		return n >= r.N
	}
	return n == r.N
}

// Options configure a simulator instance.
type Options struct {
	// Socket is the API socket path.
	Socket string
	// Latency is added to every API call.
	Latency time.Duration
	// OpLatency is added to the calls of one endpoint (after Latency): a
	// slow snapshot, say, without slowing the boots.
	OpLatency map[string]time.Duration
	// Fail lists injected failures.
	Fail []FailRule
	// SnapshotExitAfter, when >= 0, kills the process once a snapshot has
	// written this many bytes into its directory (config.json, then
	// memory-ranges, then state.json). -1 disables it.
	SnapshotExitAfter int64
	// ExitRandom, when > 0, kills the process at a uniformly random time
	// within this long after start.
	ExitRandom time.Duration
	// DirtyBytes is how much data a freshly booted guest writes into its
	// memory; snapshots write that much real data into memory-ranges.
	DirtyBytes int64
	// BalloonRate is how fast a balloon inflates or deflates towards its
	// target, in bytes per second of running guest; 0 is instant.
	BalloonRate int64
	// AgentDelay is how long after boot the guest's agent starts accepting
	// vsock connections (restored guests accept at once).
	AgentDelay time.Duration
	// GuestTick is the period of the running guest's heartbeat write and
	// page touch.
	GuestTick time.Duration
	// GuestFSBytes bounds each VM's simulated tmpfs (its files' data, paths
	// and a per-node overhead; silkagent.MemFS.Limit): a write past it is
	// ENOSPC. A VM gets at most half its memory, a tmpfs's default size.
	GuestFSBytes int64
	// VsockPorts restricts the guest ports that accept; empty accepts all.
	VsockPorts []uint32
	// NoClockVerb makes the guest's control agent refuse the clock verb,
	// as one that predates it does (clock.go).
	NoClockVerb bool
	// IgnoreSIGTERM makes the binary ignore SIGTERM, like a wedged VMM, so
	// that only SIGKILL ends it.
	IgnoreSIGTERM bool
	// Seed seeds the random exit time; 0 derives one from the clock.
	Seed int64
	// Log receives the simulator's log lines (stderr in the binary).
	Log io.Writer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Crash ends the process abruptly; nil means SIGKILL to itself, which
	// is what a crashed VMM looks like from outside.
	Crash func(reason string)
}

// DefaultOptions returns the options with every default filled in.
func DefaultOptions() Options {
	return Options{
		SnapshotExitAfter: -1,
		DirtyBytes:        DefaultDirtyBytes,
		BalloonRate:       DefaultBalloonRate,
		GuestTick:         DefaultGuestTick,
		GuestFSBytes:      DefaultGuestFSBytes,
	}
}

// ApplyEnv overlays the SBX_CHSIM_* variables read through getenv.
func (o *Options) ApplyEnv(getenv func(string) string) error {
	var errs []error
	set := func(name string, parse func(string) error) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			if err := parse(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	}
	set(EnvLatency, durationInto(&o.Latency))
	set(EnvOpLatency, opLatencyInto(o))
	set(EnvFail, func(v string) error {
		rules, err := ParseFailRules(v)
		o.Fail = append(o.Fail, rules...)
		return err
	})
	set(EnvSnapshotExitAfter, sizeInto(&o.SnapshotExitAfter))
	set(EnvExitRandom, durationInto(&o.ExitRandom))
	set(EnvDirtyBytes, sizeInto(&o.DirtyBytes))
	set(EnvBalloonRate, sizeInto(&o.BalloonRate))
	set(EnvGuestFSBytes, sizeInto(&o.GuestFSBytes))
	set(EnvAgentDelay, durationInto(&o.AgentDelay))
	set(EnvGuestTick, durationInto(&o.GuestTick))
	set(EnvVsockPorts, func(v string) error {
		ports, err := parsePorts(v)
		o.VsockPorts = ports
		return err
	})
	set(EnvIgnoreSIGTERM, func(v string) error {
		b, err := strconv.ParseBool(v)
		o.IgnoreSIGTERM = b
		return err
	})
	set(EnvNoClockVerb, func(v string) error {
		b, err := strconv.ParseBool(v)
		o.NoClockVerb = b
		return err
	})
	return errors.Join(errs...)
}

// RegisterFlags binds the fault and behaviour flags to fs; flags given on
// the command line override the environment. The --api-socket flag is
// registered by the binary, since its syntax is CH's.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.Func("latency", "added latency per API call (env "+EnvLatency+")", durationInto(&o.Latency))
	fs.Func("op-latency", "added latency of one endpoint's calls: <op>:<duration>[,...] (env "+EnvOpLatency+")", opLatencyInto(o))
	fs.Func("fail", "fail calls: <op>:<n>[+]:<status|exit|hang>[,...] (env "+EnvFail+")", func(v string) error {
		rules, err := ParseFailRules(v)
		o.Fail = append(o.Fail, rules...)
		return err
	})
	fs.Func("snapshot-exit-after", "die mid-snapshot after writing this many bytes (env "+EnvSnapshotExitAfter+")", sizeInto(&o.SnapshotExitAfter))
	fs.Func("exit-random", "die at a random time within this duration (env "+EnvExitRandom+")", durationInto(&o.ExitRandom))
	fs.Func("dirty-bytes", "data a booted guest writes into memory (env "+EnvDirtyBytes+", default 4MiB)", sizeInto(&o.DirtyBytes))
	fs.Func("balloon-rate", "balloon inflation bytes per second, 0 instant (env "+EnvBalloonRate+", default 256MiB)", sizeInto(&o.BalloonRate))
	fs.Func("guest-fs-bytes", "bound of each VM's simulated tmpfs, at most half its memory (env "+EnvGuestFSBytes+", default 256MiB)", sizeInto(&o.GuestFSBytes))
	fs.Func("guest-tick", "period of the running guest's heartbeat (env "+EnvGuestTick+", default 100ms)", durationInto(&o.GuestTick))
	fs.Func("agent-delay", "delay after boot before vsock CONNECTs are answered (env "+EnvAgentDelay+")", durationInto(&o.AgentDelay))
	fs.BoolVar(&o.IgnoreSIGTERM, "ignore-sigterm", o.IgnoreSIGTERM, "ignore SIGTERM like a wedged VMM (env "+EnvIgnoreSIGTERM+")")
	fs.BoolVar(&o.NoClockVerb, "no-clock-verb", o.NoClockVerb, "the guest's control agent refuses the clock verb (env "+EnvNoClockVerb+")")
	fs.Func("vsock-ports", "guest ports that accept vsock connections, default all (env "+EnvVsockPorts+")", func(v string) error {
		ports, err := parsePorts(v)
		o.VsockPorts = ports
		return err
	})
}

func durationInto(d *time.Duration) func(string) error {
	return func(v string) error {
		x, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		if x < 0 {
			return errors.New("negative duration")
		}
		*d = x
		return nil
	}
}

func opLatencyInto(o *Options) func(string) error {
	return func(v string) error {
		m, err := ParseOpLatency(v)
		if o.OpLatency == nil {
			o.OpLatency = map[string]time.Duration{}
		}
		for op, d := range m {
			o.OpLatency[op] = d
		}
		return err
	}
}

// ParseOpLatency parses "<op>:<duration>" pairs separated by commas, e.g.
// "vm.snapshot:500ms,vm.restore:1s"; the op must be a simulated endpoint.
func ParseOpLatency(s string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		op, dur, ok := strings.Cut(part, ":")
		if _, known := routes[op]; !ok || !known {
			return out, fmt.Errorf("op latency %q: want <op>:<duration> with a known endpoint", part)
		}
		d, err := time.ParseDuration(dur)
		if err != nil || d < 0 {
			return out, fmt.Errorf("op latency %q: want a duration >= 0", part)
		}
		out[op] = d
	}
	return out, nil
}

func sizeInto(n *int64) func(string) error {
	return func(v string) error {
		x, err := ParseSize(v)
		if err != nil {
			return err
		}
		*n = x
		return nil
	}
}

// ParseSize parses a byte count: a plain number or one with a K, M, G or T
// suffix (binary multiples; "KiB", "MB" and "k" spellings are accepted).
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	t := strings.ToUpper(s)
	t = strings.TrimSuffix(t, "IB")
	t = strings.TrimSuffix(t, "B")
	shift := 0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	if v != 0 && bits.Len64(uint64(v))+shift > 62 {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return v << shift, nil
}

// ParseFailRules parses "<op>:<n>[+]:<status|exit|hang>" rules separated by
// commas, e.g. "vm.pause:2:500,vm.snapshot:1+:exit".
func ParseFailRules(s string) ([]FailRule, error) {
	var out []FailRule
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, ":")
		if len(f) != 3 {
			return out, fmt.Errorf("fail rule %q: want <op>:<n>[+]:<status|exit|hang>", part)
		}
		r := FailRule{Op: f[0]}
		if _, ok := routes[r.Op]; !ok {
			return out, fmt.Errorf("fail rule %q: unknown endpoint %q", part, r.Op)
		}
		nstr, from := strings.CutSuffix(f[1], "+")
		n, err := strconv.Atoi(nstr)
		if err != nil || n < 1 {
			return out, fmt.Errorf("fail rule %q: call number must be >= 1", part)
		}
		r.N, r.From = n, from
		switch f[2] {
		case "exit":
			r.Action = FailExit
		case "hang":
			r.Action = FailHang
		default:
			st, err := strconv.Atoi(f[2])
			if err != nil || st < 400 || st > 599 {
				return out, fmt.Errorf("fail rule %q: status must be 400-599, exit or hang", part)
			}
			r.Action, r.Status = FailStatus, st
		}
		out = append(out, r)
	}
	return out, nil
}

func parsePorts(s string) ([]uint32, error) {
	var out []uint32
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("invalid port %q", p)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

// Usage is the binary's --help text.
const Usage = `chsim — a SIMULATOR of the Cloud Hypervisor REST API. It is not a hypervisor
and runs no guest code: it answers CH's API over a unix socket with the real
server's status codes, error bodies and VM state machine, and writes and reads
snapshot files for real, so that sbxlog can be built and tested on machines
without KVM or the cloud-hypervisor binary. One process per VM, like CH.

Usage:
  chsim --api-socket path=<socket> [fault flags]

Flags:
  --api-socket path=<socket>   the API socket (also: a bare path, or fd=<n>)
  --latency <duration>         added latency per API call
  --op-latency <op>:<dur>[,...] added latency of one endpoint's calls, e.g. vm.snapshot:500ms
  --fail <rules>               <op>:<n>[+]:<status|exit|hang>[,...]: fail the n-th
                               call of an endpoint (n+ : every call from the n-th),
                               e.g. vm.pause:2:500 or vm.restore:1:exit
  --snapshot-exit-after <size> die (SIGKILL) mid-snapshot after writing this many bytes
  --exit-random <duration>     die (SIGKILL) at a random time within this duration
  --dirty-bytes <size>         data a booted guest writes into memory (default 4MiB)
  --balloon-rate <size>        balloon inflation per second of running guest
                               (default 256MiB; 0 = instant)
  --agent-delay <duration>     time after boot before the guest answers vsock CONNECTs
  --guest-tick <duration>      period of the running guest's heartbeat write (default 100ms)
  --vsock-ports <list>         guest ports that accept vsock connections (default all)
  --ignore-sigterm             ignore SIGTERM, like a wedged VMM (only SIGKILL stops it)
  --no-clock-verb              the guest's control agent refuses the clock verb (predates it)
  --version                    print the simulated version and exit

Each flag has an environment variable, read first (flags override), because a
VMM is launched with nothing but --api-socket:
  SBX_CHSIM_LATENCY, SBX_CHSIM_OP_LATENCY, SBX_CHSIM_FAIL, SBX_CHSIM_SNAPSHOT_EXIT_AFTER,
  SBX_CHSIM_EXIT_RANDOM, SBX_CHSIM_DIRTY_BYTES, SBX_CHSIM_BALLOON_RATE,
  SBX_CHSIM_AGENT_DELAY, SBX_CHSIM_VSOCK_PORTS, SBX_CHSIM_IGNORE_SIGTERM,
  SBX_CHSIM_GUEST_TICK, SBX_CHSIM_NO_CLOCK_VERB
Sizes take K, M, G suffixes (binary). Logs go to stderr.
`
