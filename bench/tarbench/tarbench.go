// Package tarbench is the agent's whole-tree benchmark section (`go run
// ./bench -only tarbench`): fs_push and fs_pull throughput of the project's
// agent engine against tar(1) doing the same work on the same disk, and the
// agent's raw bulk path (fs_write) against a plain file write, all measured
// in the same run.
//
// sbxlog side: silkagent.Server with the machine's own backends (OSFS,
// OSProcs), as cmd/sbx-agent serves a real guest, on a unix socket in the
// scratch directory, spoken to by the project's client (silkd.Conn) in the
// same process: frames, base64, the staging directory and its merge are
// all paid. fs_push is the archive sent as data frames and extracted under
// a fresh directory; fs_pull is that tree archived back and read to the end.
//
// Floors: `tar -x -C dir` fed the same archive through a pipe (what the old
// agent ran for fs_push, without its protocol) and `tar -c -C dir .` read to
// the end (its fs_pull); for the bulk path, the archive's bytes written to
// one file with a plain write and fsync (fs_write fsyncs too).
//
// Targets: fs_push and fs_pull at least 0.5x tar(1)'s throughput, fs_write
// at least 0.5x the plain write's: the protocol (JSON frames, base64) may
// cost, but not more than the work itself.
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

const ratioTarget = 0.5

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

	sec := &report.Section{
		Name:  "tarbench",
		Title: "Agent whole-tree ops: fs_push and fs_pull against tar(1), fs_write against a plain write",
		Method: fmt.Sprintf("The agent engine (silkagent.Server with OSFS and OSProcs, as sbx-agent serves a real guest) on a unix socket in the "+
			"scratch directory, driven by the project's client in the same process, so frames, base64 and fs_push's staging and merge are paid. "+
			"Trees of silktest.TestTree (text files under 21 directories). fs_push: the archive as data frames, extracted under a fresh "+
			"directory; floor: tar -x of the same archive fed through a pipe, into a fresh directory (the old agent's way, without its "+
			"protocol). fs_pull: that tree archived back and read to the end; floor: tar -c of it read to the end. fs_write: the archive's "+
			"bytes as one file (the agent fsyncs it); floor: the same bytes written to a file and fsynced. %d rounds interleaving agent and "+
			"floor; the figure is the archive's MiB per second, median of the rounds.", cfg.rounds),
		Header: []string{"measure", "agent (MiB/s)", "floor (MiB/s)", "agent / floor"},
	}
	worst := map[string]float64{"fs_push": 1e9, "fs_pull": 1e9, "fs_write": 1e9}
	for ti, tr := range cfg.trees {
		archive, err := silktest.TarFiles(silktest.TestTree(tr.files, tr.size))
		if err != nil {
			return nil, err
		}
		mib := float64(len(archive)) / (1 << 20)
		var push, tarX, pull, tarC, write, plain []float64
		for r := range cfg.rounds {
			base := filepath.Join(dir, fmt.Sprintf("t%d-r%d", ti, r))
			agentDir, tarDir := base+"-agent", base+"-tar"
			c, err := dial()
			if err != nil {
				return nil, err
			}
			d, err := timed(func() error { return c.Push(ctx, agentDir, bytes.NewReader(archive)) })
			if err != nil {
				return nil, fmt.Errorf("fs_push: %w", err)
			}
			push = append(push, mib/d.Seconds())
			if err := os.MkdirAll(tarDir, 0o755); err != nil {
				return nil, err
			}
			d, err = timed(func() error { return runTar(ctx, bytes.NewReader(archive), io.Discard, "-x", "-C", tarDir) })
			if err != nil {
				return nil, err
			}
			tarX = append(tarX, mib/d.Seconds())

			d, err = timed(func() error { _, err := c.Pull(ctx, agentDir, io.Discard); return err })
			if err != nil {
				return nil, fmt.Errorf("fs_pull: %w", err)
			}
			pull = append(pull, mib/d.Seconds())
			d, err = timed(func() error { return runTar(ctx, nil, io.Discard, "-c", "-C", tarDir, ".") })
			if err != nil {
				return nil, err
			}
			tarC = append(tarC, mib/d.Seconds())

			d, err = timed(func() error {
				return c.WriteFile(ctx, silkd.FsWrite{Path: base + "-agent.tar"}, bytes.NewReader(archive))
			})
			if err != nil {
				return nil, fmt.Errorf("fs_write: %w", err)
			}
			write = append(write, mib/d.Seconds())
			d, err = timed(func() error { return writeSync(base+"-plain.tar", archive) })
			if err != nil {
				return nil, err
			}
			plain = append(plain, mib/d.Seconds())
			c.Close()
			for _, p := range []string{agentDir, tarDir, base + "-agent.tar", base + "-plain.tar"} {
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
			sec.AddRow(m.op+", "+label, fmt.Sprintf("%.0f", a), fmt.Sprintf("%.0f", f), fmt.Sprintf("%.2fx", a/f))
		}
	}
	for _, op := range []string{"fs_push", "fs_pull", "fs_write"} {
		floor := map[string]string{"fs_push": "tar -x", "fs_pull": "tar -c", "fs_write": "a plain write"}[op]
		sec.Verdict(worst[op] >= ratioTarget, "%s throughput at worst %.2fx %s's (target >= %.1fx)", op, worst[op], floor, ratioTarget)
	}
	sec.Notes = append(sec.Notes,
		fmt.Sprintf("client, agent and tar share the machine's %d CPUs and the scratch disk; load average at start %s, at end %s (the figures are only comparable within a run)",
			runtime.NumCPU(), loadStart, report.LoadAvg()),
		"the agent pays, over tar: base64 and JSON framing both ways, a staging directory merged by renames (fs_push), and Go's archive/tar; it does not pay a process start",
		"fs_pull's floor only reads files and writes a pipe; the agent's stream is also base64 in JSON frames that the client decodes, a per-byte cost its large-file rate shows (fs_write of one large file pays the same framing the other way)")
	return sec, nil
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
