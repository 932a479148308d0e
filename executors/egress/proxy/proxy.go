// Package proxy is sandboxd's egress proxy: a sandbox's only way out. Each
// VM has its own doors, and a connection's door is its sandbox's identity
// (no in-band token): the guest cannot name another sandbox.
//
// Doors (Open, one set per VM, opened when the VM is made and closed when
// it stops, never on a claim):
//   - a `net: egress` VM's TCP door on its tap's host address (the egress
//     bridge's), on the VM's own port, which the tap's nftables lock is the
//     only thing admitting among what crosses the bridge
//     (executors/egress/nft); the listener is bound to the device holding
//     the address (SO_BINDTODEVICE: the bridge), so nothing arriving
//     elsewhere reaches it (a host-local process through lo, a neighbour
//     routing the bridge's address through an uplink); HTTP and SOCKS5
//     share it, told apart by the first byte (0x05 is SOCKS5's version);
//   - a `net: none` VM's vsock doors: the unix sockets <vsock socket>_2049
//     (HTTP) and <vsock socket>_2050 (SOCKS5), where Cloud Hypervisor's
//     hybrid vsock delivers the guest's connections to CID 2 ports 2049 and
//     2050.
//
// At most 256 connections per door at a time; more wait in the backlog.
//
// What a door serves (the old daemon's contract), each request or tunnel
// decided by fsm/egress over the sandbox's effective policy as
// Policies.Policy reads it at that moment:
//   - HTTP forward requests (absolute-form URI with a valid authority; 400
//     otherwise), decided by
//     egress.Decide with the URL's port (or the scheme's); an https URL is
//     re-originated over verified TLS. Hop-by-hop headers are stripped both
//     ways, the rule's secret injected as its header, the body streamed.
//   - CONNECT, decided by egress.DecideTunnel: spliced, or, when the
//     decision says so (the node has a CA, the policy intercepts the host,
//     or its "inject" rule does and the claim holds a credential for it),
//     intercepted: TLS terminated with a leaf of the node CA for the host,
//     each inner request decided by egress.DecideInner and re-originated
//     over verified TLS with the rule's secret and the claim's header
//     credentials for the host injected.
//   - SOCKS5 (RFC 1928, no-auth, CONNECT only) when the policy opts in;
//     names resolved host-side; never intercepted.
//
// Answers: a refusal by the policy is 403 "egress denied: <host>" (SOCKS5
// reply 0x02), and so is a CONNECT whose authority is not host:port; a
// destination the guard refuses, or one that cannot be reached, is 502
// "egress: upstream unreachable: <why>" (SOCKS5 0x04). A host with an
// IPv6 zone ("[::%25x]") is a bad authority (400 forward, 403 CONNECT;
// SOCKS5 0x04 from the guard): a zone names a link, and the guard refuses
// every zoned address besides. The proxy resolves names itself and the
// node's guard (Config.Guard, executors/netguard) sees every address it
// connects to, inside the dialer's Control hook, so a name that resolves
// (or rebinds) to an internal address is refused whatever the policy
// said, and no packet leaves toward it.
//
// Every decision is counted (Counts) and, when its VM serves a sandbox,
// handed to the Meter with its door; payload bytes go to Meter.Transfer at
// the end of each request and tunnel and every 10 s of a long tunnel, so
// the meter aggregates per sandbox and nothing records one line per
// request. A sandbox's accounting is closed (Meter.Close) when its VM's
// doors close and the VM no longer serves it (a release or a destroy, as
// Policies.SandboxOfVM says then): doors closed for a hibernate or a
// process stop leave it open. Policies are asked per request or tunnel: a
// policy change applies to the next one.
//
// Secrets and credentials are looked up per request (Policies.SecretsFor,
// Credentials) and set on the request toward the destination only: nothing
// the guest receives carries them. A TRACE or TRACK request (whose answer
// echoes the request, headers included) that would carry one is refused
// (403, counted secret_echo), forward and intercepted alike. A rule's
// secret is injected into a plain http:// forward request too, as the old
// daemon did and its clients rely on: the value then crosses the network
// between the node and the destination in the clear (never the guest's
// side of the door), so a rule carrying a secret should name a
// destination reached over https (an https URL, or an intercepted
// CONNECT, both re-originated over verified TLS).
package proxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"net"
	"net/netip"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/netguard"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// Guest ports of the vsock doors (hybrid vsock: <socket>_<port>).
const (
	HTTPPort  = 2049
	SocksPort = 2050
)

// Defaults.
const (
	DefaultTimeout  = 30 * time.Second
	DefaultMaxConns = 256
	meterInterval   = 10 * time.Second
)

// Config configures a Server. Zero values take the defaults named.
type Config struct {
	// Policies is the egress state asked (default DenyAll).
	Policies Policies
	// Meter is told every decision and the bytes moved (default: nothing).
	Meter Meter
	// Guard judges every address the proxy connects to (default: netguard's
	// fixed table, with no allow list and no host addresses).
	Guard *netguard.Guard
	// CA signs the leaves of intercepted tunnels (nil: nothing is
	// intercepted; a tunnel whose decision asks for it is refused).
	CA *CA
	// Lookup resolves a name (default net.DefaultResolver.LookupNetIP).
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// RootCAs verify destinations' TLS (default: the system's).
	RootCAs *x509.CertPool
	// DialIn runs each outgoing dial (default: directly). Tests run it in
	// the network namespace standing for the host.
	DialIn func(func() error) error
	// Timeout bounds each dial, SOCKS5 handshake, TLS handshake and
	// request header read (default DefaultTimeout).
	Timeout time.Duration
	// MaxConns bounds a door's connections at a time (default
	// DefaultMaxConns).
	MaxConns int
	Log      zerolog.Logger
}

// Server runs the doors of every VM.
type Server struct {
	cfg   Config
	pol   Policies
	met   Meter
	guard *netguard.Guard
	log   zerolog.Logger

	mu    sync.Mutex
	doors map[string]*door
	// unsettled are, per VM, the sandboxes its closed doors served whose
	// accounting is not closed: the VM still served them (a hibernate, a
	// restart), so the Meter.Close is due when its doors close once it
	// no longer does (settle).
	unsettled map[string]map[string]bool
	nl        *netlink.Handle // route lookups of the TCP doors (routes)

	counts sync.Map // countKey -> *atomic.Uint64
}

// New returns a Server with no doors open.
func New(cfg Config) *Server {
	if cfg.Policies == nil {
		cfg.Policies = DenyAll{}
	}
	if cfg.Meter == nil {
		cfg.Meter = noMeter{}
	}
	if cfg.Guard == nil {
		cfg.Guard, _ = netguard.New(nil, nil) // no entries to parse: no error
	}
	if cfg.Lookup == nil {
		cfg.Lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if cfg.DialIn == nil {
		cfg.DialIn = func(f func() error) error { return f() }
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	return &Server{cfg: cfg, pol: cfg.Policies, met: cfg.Meter, guard: cfg.Guard, log: cfg.Log.With().Str("component", "egress-proxy").Logger(), doors: map[string]*door{}, unsettled: map[string]map[string]bool{}}
}

// Doors are one VM's doors; a zero field is not opened.
type Doors struct {
	// TCP is an egress VM's door on its tap's host address.
	TCP netip.AddrPort
	// HTTPSocket and SocksSocket are a vsock guest's door sockets.
	HTTPSocket, SocksSocket string
}

// VsockDoors are the doors of a VM whose hybrid-vsock socket is socket.
func VsockDoors(socket string) Doors {
	return Doors{HTTPSocket: fmt.Sprintf("%s_%d", socket, HTTPPort), SocksSocket: fmt.Sprintf("%s_%d", socket, SocksPort)}
}

// Open opens vm's doors. Doors already open as asked are left alone;
// different ones are closed first.
func (s *Server) Open(vm string, d Doors) error {
	s.mu.Lock()
	old := s.doors[vm]
	s.mu.Unlock()
	if old != nil {
		if old.spec == d {
			return nil
		}
		s.CloseDoors(vm)
	}
	dr, err := s.openDoor(vm, d)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if cur := s.doors[vm]; cur != nil {
		// A concurrent Open won: keep its doors (these served nothing).
		s.mu.Unlock()
		dr.close()
		return nil
	}
	s.doors[vm] = dr
	s.mu.Unlock()
	return nil
}

// CloseDoors closes vm's doors and every connection through them; their
// sandboxes' bytes are reported. The meter is told a sandbox closed
// (Meter.Close, its final record) only once vm no longer serves it (a
// release, a destroy: Policies.SandboxOfVM says so as the doors close);
// a VM that still serves it (a hibernate, a restart) keeps its
// accounting open, and a later CloseDoors of the VM, its doors open
// again or not (a hibernated claim released), closes it.
func (s *Server) CloseDoors(vm string) {
	s.mu.Lock()
	d := s.doors[vm]
	delete(s.doors, vm)
	s.mu.Unlock()
	var served map[string]bool
	if d != nil {
		served = d.close()
	}
	s.settle(vm, served)
}

// settle closes the accounting of the sandboxes vm's doors served (now,
// and before) that vm no longer serves.
func (s *Server) settle(vm string, served map[string]bool) {
	s.mu.Lock()
	sbs := s.unsettled[vm]
	delete(s.unsettled, vm)
	s.mu.Unlock()
	if sbs == nil {
		sbs = map[string]bool{}
	}
	for sb := range served {
		sbs[sb] = true
	}
	if len(sbs) == 0 {
		return
	}
	cur, live := s.pol.SandboxOfVM(vm)
	for sb := range sbs {
		if live && sb == cur {
			continue
		}
		delete(sbs, sb)
		s.met.Close(sb)
	}
	if len(sbs) == 0 {
		return
	}
	s.mu.Lock()
	if cur := s.unsettled[vm]; cur != nil {
		for sb := range cur {
			sbs[sb] = true
		}
	}
	s.unsettled[vm] = sbs
	s.mu.Unlock()
}

// Close closes every door as the process stops: the bytes in flight are
// reported, but no sandbox's accounting is closed (its VM keeps running,
// and the next process's doors go on counting it).
func (s *Server) Close() {
	s.mu.Lock()
	ds := make([]*door, 0, len(s.doors))
	for vm, d := range s.doors {
		ds = append(ds, d)
		delete(s.doors, vm)
	}
	s.mu.Unlock()
	for _, d := range ds {
		d.close()
	}
	s.mu.Lock()
	if s.nl != nil {
		s.nl.Close()
		s.nl = nil
	}
	s.mu.Unlock()
}

// routes is the netlink handle the TCP doors look their peers up with,
// made on the first one's Open, in the network namespace Open runs in:
// every door of a Server is in one (the egress bridge's).
func (s *Server) routes() (*netlink.Handle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nl == nil {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, err
		}
		s.nl = h
	}
	return s.nl, nil
}

// OpenDoors reports vm's open doors.
func (s *Server) OpenDoors(vm string) (Doors, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.doors[vm]
	if !ok {
		return Doors{}, false
	}
	return d.spec, true
}

// GuestEnv is what a guest needs to use its doors: the proxy variables
// (a vsock guest's point at the relay the guest image runs on
// 127.0.0.1:3128 toward port 2049) and, when the node has a CA, its
// certificate (SBX_EGRESS_CA_PEM, public) and where the guest installs it
// (SBX_EGRESS_CA_FILE). Nothing secret: the guest env is the guest's.
func (s *Server) GuestEnv(vm string) map[string]string {
	d, ok := s.OpenDoors(vm)
	if !ok {
		return nil
	}
	url := "http://127.0.0.1:3128"
	if d.TCP.IsValid() {
		url = "http://" + d.TCP.String()
	}
	env := map[string]string{"http_proxy": url, "https_proxy": url, "HTTP_PROXY": url, "HTTPS_PROXY": url}
	if s.cfg.CA != nil {
		env["SBX_EGRESS_CA_FILE"] = agent.GuestCAFile // where the guest agent installs it
		env["SBX_EGRESS_CA_PEM"] = string(s.cfg.CA.PEM())
	}
	return env
}

// CAPEM is the node CA's certificate (public), nil without one: what
// guests trust for intercepted tunnels.
func (s *Server) CAPEM() []byte {
	if s.cfg.CA == nil {
		return nil
	}
	return s.cfg.CA.PEM()
}

// Count is the number of decisions of one door with one outcome ("allow",
// or the refusal's reason).
type Count struct {
	Door, Outcome string
	N             uint64
}

type countKey struct{ door, outcome string }

// Counts returns every decision counter, sorted.
func (s *Server) Counts() []Count {
	var out []Count
	s.counts.Range(func(k, v any) bool {
		ck := k.(countKey)
		out = append(out, Count{Door: ck.door, Outcome: ck.outcome, N: v.(*atomic.Uint64).Load()})
		return true
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Door != out[j].Door {
			return out[i].Door < out[j].Door
		}
		return out[i].Outcome < out[j].Outcome
	})
	return out
}

// record counts a decision and hands it to the meter when it is a
// sandbox's: a VM that serves none (warm, or released with its doors
// still open) has nothing to account, and a record of claim "" would be
// refused by the log.
func (s *Server) record(sandbox, doorName string, d egress.Decision) {
	outcome := "allow"
	if !d.Allow {
		outcome = string(d.Reason)
		if outcome == "" {
			outcome = "deny"
		}
	}
	k := countKey{doorName, outcome}
	v, ok := s.counts.Load(k)
	if !ok {
		v, _ = s.counts.LoadOrStore(k, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
	if sandbox != "" {
		s.met.Decision(sandbox, doorName, d)
	}
}

// listenDoor binds one door: a unix socket (a stale file removed first)
// or TCP, bound to the device that holds the door's address (found
// through nl, the Server's netlink handle, which TCP doors have).
func listenDoor(network, addr string, nl *netlink.Handle) (net.Listener, error) {
	if network == "unix" {
		if err := os.Remove(addr); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
		if err != nil {
			return nil, err
		}
		ln.SetUnlinkOnClose(true)
		return ln, nil
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("door %s: %w", addr, err)
	}
	dev, err := deviceOf(nl, ap.Addr())
	if err != nil {
		return nil, fmt.Errorf("door %s: %w", addr, err)
	}
	// The nftables locks admit only a tap's guest to its door among what
	// crosses the bridge; the binding keeps out what does not cross it: a
	// host-local process (through lo) and a neighbour that routes the
	// bridge's address through the host's uplink (Linux accepts a local
	// address on any interface).
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bind to device %s: %w", dev, serr)
		}
		return nil
	}}
	return lc.Listen(context.Background(), network, addr)
}

// deviceOf is the interface that holds ip (the egress bridge for a lane's
// door): one dump of the addresses and one link lookup, whatever the
// number of interfaces (a host with many taps has many).
func deviceOf(nl *netlink.Handle, ip netip.Addr) (string, error) {
	if nl == nil {
		return "", errors.New("no netlink handle")
	}
	addrs, err := nft.Dumped(func() ([]netlink.Addr, error) { return nl.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return "", err
	}
	want := ip.Unmap().WithZone("")
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		if got, ok := netip.AddrFromSlice(a.IP); ok && got.Unmap() == want {
			link, err := nl.LinkByIndex(a.LinkIndex)
			if err != nil {
				return "", err
			}
			return link.Attrs().Name, nil
		}
	}
	return "", fmt.Errorf("no interface holds %s", ip)
}
