// Package relaybench is the data plane's benchmark section (`go run ./bench
// -only relaybench`): relay throughput and connect latency through
// sandboxd's agent relay, against a direct unix-socket copy floor measured
// in the same run.
//
// sbxlog side: nodetest's in-process node (started by bench/relaynode,
// with its echo guest and copy floor), i.e. the real api.Server, engine
// and Pebble op log on the scratch disk (each relay's opening is a
// durable relay_opened event, its end a relay_closed one) behind a real
// net/http server on loopback, with the hypervisor FAKED and the guest
// agent replaced by an echo server on a unix socket, which the node's
// dialer reaches the way it reaches a hybrid-vsock socket (a raw
// *net.UnixConn: the relay splices). A relay: a TCP connection to the node,
// the old SDK's exact upgrade request for GET /v1/sandboxes/{id}/agent
// (sandbox token), the 101, then bytes through the node to the echo.
//
// Floor ("a direct unix-socket copy"): the same client and echo server
// joined by a plain io.Copy each way between the client's TCP connection
// and a fresh connection to the echo's unix socket, in the benchmark's own
// process (Go splices these too): the relay without sandboxd. A reference
// row shows the echo reached over its unix socket with no hop at all, the
// cost of the TCP hop itself.
//
// Targets (issue 17, acceptance 5): relay throughput at least 0.8x the
// floor's; connect p50 within 1 ms of the floor's.
package relaybench

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"time"

	"github.com/sbxlog/sbxlog/bench/relaynode"
	"github.com/sbxlog/sbxlog/bench/report"
)

type config struct {
	connects int   // connect samples per system
	rounds   int   // throughput rounds, alternating relay and floor
	total    int64 // bytes one throughput run sends (and gets back), split over its streams
	streams  []int // concurrent streams per throughput row
}

var (
	full  = config{connects: 2000, rounds: 5, total: 1 << 30, streams: []int{1, 8}}
	quick = config{connects: 200, rounds: 2, total: 64 << 20, streams: []int{1, 8}}
)

const (
	ratioTarget   = 0.8
	connectTarget = time.Millisecond
)

// Run measures the section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := full
	if opts.Quick {
		cfg = quick
	}
	loadStart := report.LoadAvg()
	dir, done, err := opts.Dir("relaybench")
	if err != nil {
		return nil, err
	}
	defer done()
	guest, err := relaynode.StartEcho(filepath.Join(dir, "guest.sock"))
	if err != nil {
		return nil, err
	}
	defer guest.Close()
	n, err := relaynode.Start(ctx, filepath.Join(dir, "node"), guest.Path)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	relayDial := n.DialUpgrade
	cp, err := relaynode.StartCopier(guest.Path)
	if err != nil {
		return nil, err
	}
	defer cp.Close()
	floorDial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", cp.Addr())
	}
	directDial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", guest.Path)
	}

	sec := &report.Section{
		Name:  "relaybench",
		Title: "Data plane: agent relay throughput and connect latency, vs a direct unix-socket copy",
		Method: fmt.Sprintf("In-process node (nodetest: real API, engine and Pebble op log on the scratch disk, loopback HTTP; hypervisor FAKED), "+
			"the guest agent replaced by an echo server on a unix socket, which the node's guest dialer reaches as it does a hybrid-vsock socket "+
			"(raw *net.UnixConn, so the relay runs on splice(2)). Relay: TCP to the node, the old SDK's exact upgrade request for "+
			"GET /v1/sandboxes/{id}/agent with the sandbox token, the 101, then through the node to the echo. Floor, a direct unix-socket "+
			"copy: the same client over TCP to a listener in the benchmark's process that joins each connection to a fresh connection to "+
			"the echo's unix socket with a plain io.Copy each way (spliced too), i.e. the relay without sandboxd. Reference: the echo "+
			"dialed over its unix socket with no hop. Connect: %d samples per system, interleaved, each a fresh connection until its first "+
			"echoed byte (the relay's includes its durable relay_opened event; its relay_closed is written after the sample). Throughput: "+
			"%d rounds interleaving the systems, each run sending %d MiB split over its streams in %d KiB writes while each stream reads "+
			"its echo back; the figure is the bytes echoed per second (each direction moves as much), median of the rounds.",
			cfg.connects, cfg.rounds, cfg.total>>20, relaynode.Chunk>>10),
		Header: []string{"measure", "relay (sandboxd)", "floor (direct copy)", "relay / floor", "no hop (reference)"},
	}

	// Connect latency, interleaved samples so drift hits all alike.
	dials := []func(context.Context) (net.Conn, error){relayDial, floorDial, directDial}
	lat := make([]report.Durations, len(dials))
	for i := range len(dials) * cfg.connects {
		d, err := connectOnce(ctx, dials[i%len(dials)])
		if err != nil {
			return nil, fmt.Errorf("connect sample %d: %w", i, err)
		}
		lat[i%len(dials)] = append(lat[i%len(dials)], d)
	}
	relayLat, floorLat := lat[0], lat[1]
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		r, f := relayLat.Quantile(q.q), floorLat.Quantile(q.q)
		sec.AddRow("connect to first echoed byte, "+q.name, report.Fmt(r), report.Fmt(f), fmt.Sprintf("+%s", report.Fmt(r-f)), report.Fmt(lat[2].Quantile(q.q)))
	}
	p50diff := relayLat.Quantile(0.5) - floorLat.Quantile(0.5)
	sec.Verdict(p50diff <= connectTarget, "connect p50 %s through the relay, %s through the direct copy: %s more (target within %s)",
		report.Fmt(relayLat.Quantile(0.5)), report.Fmt(floorLat.Quantile(0.5)), report.Fmt(p50diff), report.Fmt(connectTarget))

	// Throughput.
	worst := 1e9
	for _, streams := range cfg.streams {
		bps := make([][]float64, len(dials))
		for range cfg.rounds {
			for i, dial := range dials {
				b, err := relaynode.Throughput(ctx, dial, streams, cfg.total/int64(streams))
				if err != nil {
					return nil, fmt.Errorf("throughput (system %d): %w", i, err)
				}
				bps[i] = append(bps[i], b)
			}
		}
		r, f := median(bps[0]), median(bps[1])
		ratio := r / f
		worst = min(worst, ratio)
		sec.AddRow(fmt.Sprintf("throughput, %d stream(s) echoing at once", streams), gibps(r), gibps(f), fmt.Sprintf("%.2fx", ratio), gibps(median(bps[2])))
	}
	sec.Verdict(worst >= ratioTarget, "relay throughput at worst %.2fx the direct unix-socket copy's (target >= %.1fx)", worst, ratioTarget)
	sec.Notes = append(sec.Notes,
		fmt.Sprintf("the client, the node and the echo server share the machine's %d CPUs; load average at start %s, at end %s (other load dilutes both systems alike; the figures are only comparable within a run)",
			runtime.NumCPU(), loadStart, report.LoadAvg()),
		"the relay's extra cost over the direct copy is, at connect, the node's work (parse the request, authenticate, read the state, dial the guest, make relay_opened durable: one fsync, shared with concurrent ones; write the 101) and, in flight, nothing: both splice; the no-hop reference shows what the TCP hop itself costs on this machine")
	return sec, nil
}
