// Package tarbench is the agent's whole-tree benchmark section (`go run
// ./bench -only tarbench`): fs_push and fs_pull throughput of the project's
// agent engine against tar(1) doing the same work on the same disk, the
// agent's raw bulk path (fs_write) against a plain file write, and fs_push
// and fs_pull through sandboxd's agent relay against the same ops direct
// and against the relay's raw rate, all measured in the same run.
//
// sbxlog side: silkagent.Server with the machine's own backends (OSFS,
// OSProcs), as cmd/sbx-agent serves a real guest, on a unix socket in the
// scratch directory, spoken to by the project's client (silkd.Conn) in the
// same process: frames, base64, the staging directory and its merge are
// all paid. fs_push is the archive sent as data frames and extracted under
// a fresh directory; fs_pull is that tree archived back and read to the end.
// Relayed: bench/relaynode's in-process node (real API, engine, Pebble; the
// hypervisor faked) whose guest dialer reaches that same agent socket, the
// client on apiclient's DialAgent connection; the relay's raw rate is an
// echo guest's through the same node and relay (as relaybench measures it).
//
// Floors: `tar -x -C dir` fed the same archive through a pipe (what the old
// agent ran for fs_push, without its protocol) and `tar -c -C dir .` read to
// the end (its fs_pull); for the bulk path, the archive's bytes written to
// one file with a plain write and fsync (fs_write fsyncs too); for the
// relayed ops, the same op on a direct connection.
//
// Targets: fs_push and fs_pull at least 0.5x tar(1)'s throughput, fs_write
// at least 0.5x the plain write's: the protocol (JSON frames, base64) may
// cost, but not more than the work itself. Through the relay, at least 0.8x
// the direct op (the relay splices, so in flight it should cost next to
// nothing; 0.8x is relaybench's target for raw bytes, issue 17), and the
// relayed fs_push at most 0.5x the relay's raw echo rate (the relay has
// room to spare: the op, not the relay, bounds the rate).
package tarbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"time"

	"github.com/sbxlog/sbxlog/bench/relaynode"
	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent/silktest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

type config struct {
	rounds int
	trees  []tree
}

// tree is one archive shape: files of size bytes.
type tree struct {
	files, size int
}

var (
	full  = config{rounds: 5, trees: []tree{{1000, 10 << 10}, {100, 1 << 20}}}
	quick = config{rounds: 2, trees: []tree{{1000, 10 << 10}}}
)

const (
	ratioTarget    = 0.5
	relayTarget    = 0.8
	headroomTarget = 0.5
)

// floorOf names each op's floor.
var floorOf = map[string]string{"fs_push": "tar -x", "fs_pull": "tar -c", "fs_write": "a plain write"}

// Run measures the section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := full
	if opts.Quick {
		cfg = quick
	}
	if _, err := exec.LookPath("tar"); err != nil {
		return nil, fmt.Errorf("tarbench needs tar(1) for its floor: %w", err)
	}
	loadStart := report.LoadAvg()
	dir, done, err := opts.Dir("tarbench")
	if err != nil {
		return nil, err
	}
	defer done()
	l, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		return nil, err
	}
	defer l.Close()
	srv := &silkagent.Server{FS: silkagent.OSFS{}, Procs: silkagent.OSProcs{}}
	go func() { _ = srv.Serve(l) }()
	dial := func() (*silkd.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", l.Addr().String())
		if err != nil {
			return nil, err
		}
		return silkd.NewConn(nc), nil
	}
	// sandboxd's agent relay: the node's guest is the same agent, or the
	// echo while the relay's raw rate is measured.
	echo, err := relaynode.StartEcho(filepath.Join(dir, "echo.sock"))
	if err != nil {
		return nil, err
	}
	defer echo.Close()
	node, err := relaynode.Start(ctx, filepath.Join(dir, "node"), l.Addr().String())
	if err != nil {
		return nil, err
	}
	defer node.Close()
	dialRelayed := func() (*silkd.Conn, error) {
		node.SetGuest(l.Addr().String())
		nc, err := node.DialAgent(ctx)
		if err != nil {
			return nil, err
		}
		return silkd.NewConn(nc), nil
	}
	// The same hop without sandboxd: a plain copy each way to the agent.
	cp, err := relaynode.StartCopier(l.Addr().String())
	if err != nil {
		return nil, err
	}
	defer cp.Close()
	dialCopied := func() (*silkd.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", cp.Addr())
		if err != nil {
			return nil, err
		}
		return silkd.NewConn(nc), nil
	}
	echoRelayed := func(ctx context.Context) (net.Conn, error) {
		node.SetGuest(echo.Path)
		return node.DialUpgrade(ctx)
	}

	sec := &report.Section{
		Name:  "tarbench",
		Title: "Agent whole-tree ops: fs_push and fs_pull against tar(1), fs_write against a plain write",
		Method: fmt.Sprintf("The agent engine (silkagent.Server with OSFS and OSProcs, as sbx-agent serves a real guest) on a unix socket in the "+
			"scratch directory, driven by the project's client in the same process, so frames, base64 and fs_push's staging and merge are paid. "+
			"Trees of silktest.TestTree (text files under 21 directories). fs_push: the archive as data frames, extracted under a fresh "+
			"directory; floor: tar -x of the same archive fed through a pipe, into a fresh directory (the old agent's way, without its "+
			"protocol). fs_pull: that tree archived back and read to the end; floor: tar -c of it read to the end. fs_write: the archive's "+
			"bytes as one file (the agent fsyncs it); floor: the same bytes written to a file and fsynced. Through the relay: an in-process "+
			"sandboxd (bench/relaynode: nodetest's node, real API, engine and Pebble op log, hypervisor FAKED) whose guest dialer reaches "+
			"the same agent socket as it reaches a hybrid-vsock socket; the client opens GET /v1/sandboxes/{id}/agent with apiclient's "+
			"DialAgent (sandbox token) and runs fs_push then fs_pull on that connection (the connect is not timed: relaybench times it); "+
			"compared with the same ops direct, and, for reference, through the same hop without sandboxd (relaybench's floor: loopback TCP "+
			"to a listener that joins it to the agent's socket with a plain io.Copy each way). The relay's raw rate: the archive's size of bytes sent through the same node's relay to an "+
			"echo guest and read back, one stream, %d KiB writes (relaybench's measure), in MiB echoed per second. "+
			"Targets: the agent ops at least %.1fx their floor (the protocol may cost, not more than the work); through the relay at least "+
			"%.1fx the direct op (the relay splices, so in flight it should cost next to nothing; an operator would not accept losing more "+
			"than a fifth, relaybench's target for raw bytes); relayed fs_push at most %.1fx the relay's raw rate (the relay has room to spare, "+
			"so the op, not the relay, bounds it). %d rounds interleaving agent, relay and floors; the figure is the archive's MiB per second, "+
			"median of the rounds; within a round each phase (push, pull, write) runs its systems in an order rotated per round.", relaynode.Chunk>>10, ratioTarget, relayTarget, headroomTarget, cfg.rounds),
		Header: []string{"measure", "sbxlog (MiB/s)", "comparator (MiB/s)", "sbxlog / comparator"},
	}
	worst := map[string]float64{"fs_push": 1e9, "fs_pull": 1e9, "fs_write": 1e9}
	relayWorst := map[string]float64{"fs_push": 1e9, "fs_pull": 1e9}
	var headroom float64
	for ti, tr := range cfg.trees {
		archive, err := silktest.TarFiles(silktest.TestTree(tr.files, tr.size))
		if err != nil {
			return nil, err
		}
		mib := float64(len(archive)) / (1 << 20)
		var push, tarX, pull, tarC, write, plain, rpush, rpull, cpush, cpull, raw []float64
		for r := range cfg.rounds {
			base := filepath.Join(dir, fmt.Sprintf("t%d-r%d", ti, r))
			agentDir, relayDir, copyDir, tarDir := base+"-agent", base+"-relay", base+"-copy", base+"-tar"
			c, err := dial()
			if err != nil {
				return nil, err
			}
			rc, err := dialRelayed()
			if err != nil {
				return nil, fmt.Errorf("relay: %w", err)
			}
			cc, err := dialCopied()
			if err != nil {
				return nil, err
			}
			if err := os.MkdirAll(tarDir, 0o755); err != nil {
				return nil, err
			}
			// Each phase's systems in an order rotated per round, so
			// whatever one leaves behind (dirty pages, a busy CPU) falls on
			// each of the others alike.
			phases := [][]step{{
				{"fs_push", &push, func() error { return c.Push(ctx, agentDir, bytes.NewReader(archive)) }},
				{"fs_push through the relay", &rpush, func() error { return rc.Push(ctx, relayDir, bytes.NewReader(archive)) }},
				{"fs_push through a plain copy", &cpush, func() error { return cc.Push(ctx, copyDir, bytes.NewReader(archive)) }},
				{"tar -x", &tarX, func() error { return runTar(ctx, bytes.NewReader(archive), io.Discard, "-x", "-C", tarDir) }},
			}, {
				{"fs_pull", &pull, func() error { _, err := c.Pull(ctx, agentDir, io.Discard); return err }},
				{"fs_pull through the relay", &rpull, func() error { _, err := rc.Pull(ctx, relayDir, io.Discard); return err }},
				{"fs_pull through a plain copy", &cpull, func() error { _, err := cc.Pull(ctx, copyDir, io.Discard); return err }},
				{"tar -c", &tarC, func() error { return runTar(ctx, nil, io.Discard, "-c", "-C", tarDir, ".") }},
			}, {
				{"fs_write", &write, func() error {
					return c.WriteFile(ctx, silkd.FsWrite{Path: base + "-agent.tar"}, bytes.NewReader(archive))
				}},
				{"a plain write", &plain, func() error { return writeSync(base+"-plain.tar", archive) }},
			}}
			for _, ph := range phases {
				for i := range ph {
					st := ph[(i+r)%len(ph)]
					d, err := timed(st.run)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", st.name, err)
					}
					*st.into = append(*st.into, mib/d.Seconds())
				}
			}
			c.Close()
			rc.Close()
			cc.Close()
			bps, err := relaynode.Throughput(ctx, echoRelayed, 1, int64(len(archive)))
			if err != nil {
				return nil, fmt.Errorf("relay echo: %w", err)
			}
			raw = append(raw, bps/(1<<20))
			for _, p := range []string{agentDir, tarDir, relayDir, copyDir, base + "-agent.tar", base + "-plain.tar"} {
				_ = os.RemoveAll(p)
			}
		}
		label := fmt.Sprintf("%d files of %d KiB (%.1f MiB of tar)", tr.files, tr.size>>10, mib)
		for _, m := range []struct {
			op          string
			agent, base []float64
		}{{"fs_push", push, tarX}, {"fs_pull", pull, tarC}, {"fs_write", write, plain}} {
			a, f := median(m.agent), median(m.base)
			worst[m.op] = min(worst[m.op], a/f)
			sec.AddRow(m.op+" vs "+floorOf[m.op]+", "+label, fmt.Sprintf("%.0f", a), fmt.Sprintf("%.0f", f), fmt.Sprintf("%.2fx", a/f))
		}
		for _, m := range []struct {
			op         string
			relayed, c []float64
		}{{"fs_push", rpush, push}, {"fs_pull", rpull, pull}} {
			r, d := median(m.relayed), median(m.c)
			relayWorst[m.op] = min(relayWorst[m.op], r/d)
			sec.AddRow(m.op+" through the relay vs direct, "+label, fmt.Sprintf("%.0f", r), fmt.Sprintf("%.0f", d), fmt.Sprintf("%.2fx", r/d))
		}
		for _, m := range []struct {
			op         string
			relayed, c []float64
		}{{"fs_push", rpush, cpush}, {"fs_pull", rpull, cpull}} {
			r, d := median(m.relayed), median(m.c)
			sec.AddRow(m.op+" through the relay vs through a plain copy (the hop without sandboxd), "+label, fmt.Sprintf("%.0f", r), fmt.Sprintf("%.0f", d), fmt.Sprintf("%.2fx", r/d))
		}
		r, e := median(rpush), median(raw)
		headroom = max(headroom, r/e)
		sec.AddRow("fs_push through the relay vs the relay's raw echo, "+label, fmt.Sprintf("%.0f", r), fmt.Sprintf("%.0f", e), fmt.Sprintf("%.2fx", r/e))
	}
	for _, op := range []string{"fs_push", "fs_pull", "fs_write"} {
		sec.Verdict(worst[op] >= ratioTarget, "%s throughput at worst %.2fx %s's (target >= %.1fx)", op, worst[op], floorOf[op], ratioTarget)
	}
	for _, op := range []string{"fs_push", "fs_pull"} {
		sec.Verdict(relayWorst[op] >= relayTarget, "%s through sandboxd's relay at worst %.2fx of %s direct (target >= %.1fx)", op, relayWorst[op], op, relayTarget)
	}
	sec.Verdict(headroom <= headroomTarget, "fs_push through the relay at most %.2fx the relay's raw echo rate (target <= %.1fx: the op, not the relay, bounds it)", headroom, headroomTarget)
	sec.Notes = append(sec.Notes,
		fmt.Sprintf("client, agent and tar share the machine's %d CPUs and the scratch disk; load average at start %s, at end %s (the figures are only comparable within a run)",
			runtime.NumCPU(), loadStart, report.LoadAvg()),
		"the agent pays, over tar: base64 and JSON framing both ways, a staging directory merged by renames (fs_push), and Go's archive/tar; it does not pay a process start",
		"fs_pull's floor only reads files and writes a pipe; the agent's stream is also base64 in JSON frames that the client decodes, a per-byte cost its large-file rate shows (fs_write of one large file pays the same framing the other way). A CPU profile of repeated fs_pulls of 100 files of 1 MiB finds, outside the socket's syscalls, the standard library's base64 encode (agent) and decode (client) working straight into reused frame buffers, and nothing per file (no flush, copy or allocation) worth removing: the gap is the framing's, inherent to the wire format",
		"through the relay the connection's bytes are spliced by the node (the relay's raw echo row), so a relayed op pays no copy in user space; it does pay a loopback TCP hop the direct rows (the agent's unix socket, no hop) do not, on the same CPUs as the base64 work; its connect (the upgrade and the durable relay_opened event) is not timed here, relaybench times it")
	return sec, nil
}

// step is one timed system of a round: its rate goes into into.
type step struct {
	name string
	into *[]float64
	run  func() error
}

func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

func runTar(ctx context.Context, stdin io.Reader, stdout io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, "tar", args...)
	cmd.Stdin, cmd.Stdout = stdin, stdout
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("tar %v: %v: %s", args, err, stderr.String())
	}
	return nil
}

func writeSync(p string, b []byte) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}
