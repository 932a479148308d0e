// Package agentbench is the benchmark section of the guest agent's RPCs
// (issue 23): the real agent engine (executors/guest/silkagent with the
// host's processes and shells, as cmd/sbx-agent serves them in the guest)
// on a unix socket, driven through the project's client on one open
// connection. Each RPC is set against its floors, measured interleaved in
// the same run: an info round trip on the same connection (the protocol's
// cost), and the OS work the RPC cannot avoid (a fork+exec+wait of the
// same command; a line through a bare shell's pipes). Outside a quick run
// the real agent in one QEMU guest (TCG) is timed too, against its own
// info.
package agentbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/executors/guest/guesttest"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/executors/qemu"
)

type config struct {
	rounds, perRound, guestRounds int
	guest                         bool
}

var (
	full  = config{rounds: 10, perRound: 100, guestRounds: 3, guest: true}
	quick = config{rounds: 2, perRound: 10}
)

// measure is one timed RPC (or floor).
type measure struct {
	name string
	run  func() error
}

// sample runs the measures in rounds of perRound samples each, the order
// rotated per round, and returns each one's samples.
func sample(measures []measure, rounds, perRound int) ([]report.Durations, error) {
	samples := make([]report.Durations, len(measures))
	for round := range rounds {
		for i := range measures {
			k := (i + round) % len(measures)
			for range perRound {
				start := time.Now()
				if err := measures[k].run(); err != nil {
					return nil, fmt.Errorf("%s: %w", measures[k].name, err)
				}
				samples[k] = append(samples[k], time.Since(start))
			}
		}
	}
	return samples, nil
}

// guestMeasures name the rows of the QEMU guest, in measureGuest's order.
var guestMeasures = []string{"info", "exec true", "session: true"}

// measureGuest boots one TCG guest with the project's agent and times
// guestMeasures on one connection to it.
func measureGuest(ctx context.Context, dir string, cfg config) ([]report.Durations, error) {
	if !cfg.guest {
		return nil, errors.New("not in a quick run")
	}
	g, err := guesttest.Build(ctx)
	if err != nil {
		return nil, err
	}
	q, err := qemu.NewRecipes(qemu.RecipesConfig{Accel: qemu.AccelTCG, Log: zerolog.Nop(), StopGrace: 3 * time.Second})
	if err != nil {
		return nil, err
	}
	spec := qemu.Spec{RunDir: filepath.Join(dir, "run"), StoreDir: filepath.Join(dir, "store"), MemoryMiB: 256, Kernel: g.Kernel, Initrd: g.Initrd}
	if err := os.MkdirAll(spec.StoreDir, 0o700); err != nil {
		return nil, err
	}
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := q.Boot(bctx, spec); err != nil {
		return nil, err
	}
	defer func() { _, _ = q.Destroy(context.Background(), spec) }()
	nc, err := q.DialAgent(bctx, spec.RunDir)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	c := silkd.NewConn(nc)
	sid, err := c.CreateSession(bctx, silkd.SessionCreate{})
	if err != nil {
		return nil, err
	}
	return sample([]measure{
		{guestMeasures[0], func() error { _, err := c.Info(bctx); return err }},
		{guestMeasures[1], func() error {
			return exitZero(c.Exec(bctx, silkd.Exec{Argv: []string{"true"}}, silkd.ExecIO{}))
		}},
		{guestMeasures[2], func() error {
			return exitZero(c.Exec(bctx, silkd.Exec{Argv: []string{"true"}, Session: sid}, silkd.ExecIO{}))
		}},
	}, cfg.guestRounds, cfg.perRound)
}

// Run measures the section.
func Run(ctx context.Context, opts report.Options) (*report.Section, error) {
	cfg := full
	if opts.Quick {
		cfg = quick
	}
	loadStart := report.LoadAvg()
	dir, done, err := opts.Dir("agentbench")
	if err != nil {
		return nil, err
	}
	defer done()
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	srv := &silkagent.Server{Procs: silkagent.OSProcs{}, FS: silkagent.OSFS{}}
	go func() { _ = srv.Serve(l) }()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	c := silkd.NewConn(nc)
	sid, err := c.CreateSession(ctx, silkd.SessionCreate{})
	if err != nil {
		return nil, err
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		return nil, err
	}
	pipe, err := startBareShell()
	if err != nil {
		return nil, err
	}
	defer pipe.close()
	// A detached process for logs, which stays in the table while the
	// execs come and go (exited ones are forgotten past MaxExited).
	res, err := c.Exec(ctx, silkd.Exec{Argv: []string{"sh", "-c", "echo kept; exec sleep 3600"}, Detach: true}, silkd.ExecIO{})
	if err != nil {
		return nil, err
	}
	logsPid := res.Pid
	defer func() { _ = c.Kill(context.Background(), logsPid, nil) }()

	measures := []measure{
		{"info (floor: the protocol)", func() error { _, err := c.Info(ctx); return err }},
		{"exec true", func() error {
			r, err := c.Exec(ctx, silkd.Exec{Argv: []string{truePath}}, silkd.ExecIO{})
			return exitZero(r, err)
		}},
		{"fork+exec+wait of true (floor: the OS)", func() error { return exec.Command(truePath).Run() }},
		{"session: true", func() error {
			r, err := c.Exec(ctx, silkd.Exec{Argv: []string{"true"}, Session: sid}, silkd.ExecIO{})
			return exitZero(r, err)
		}},
		{"a line through a bare shell (floor: the shell)", pipe.roundTrip},
		{"logs of a detached process", func() error {
			_, err := c.Logs(ctx, logsPid, io.Discard, io.Discard)
			return err
		}},
	}
	samples, err := sample(measures, cfg.rounds, cfg.perRound)
	if err != nil {
		return nil, err
	}
	sec := &report.Section{
		Name:  "agentbench",
		Title: "Guest agent: RPC round trips on an open connection, vs the protocol and the OS",
		Method: fmt.Sprintf("The agent engine (executors/guest/silkagent.Server with OSProcs: the host's processes and shell, as sbx-agent serves them in the guest) "+
			"in the benchmark's process on a unix socket; the project's client (silkd.Conn) on one connection kept open. "+
			"Each RPC is timed from its request to its terminal frame: exec of true (started, exit), the same in a session "+
			"(the persistent shell, framed by its nonce marker; bash or sh), logs of a detached process (its kept output line, done). "+
			"Floors, interleaved with them: info on the same connection (the protocol's round trip), a fork+exec+wait of true "+
			"by os/exec in the benchmark's process (what an exec cannot avoid), a line written to a bare shell's stdin and its echo "+
			"read back (what a session command cannot avoid; the same shell).  %d rounds of %d samples each, the order rotated per round. "+
			"Targets, from what the protocol must add to the OS work: exec p50 at most %.1fx the fork+exec+wait p50 plus %d info p50s "+
			"(its request and two replies, started and exit, around the same os/exec the floor runs; the tenth covers the agent's pipes "+
			"and reaper and the floor's own noise); a session command's p50 at most the bare shell line's plus %s (its script, the command "+
			"in a group with stdin from /dev/null and then the nonce marker's printf of its status, read by the shell from its pipe (bash: a byte at a "+
			"time) and framed by the agent, is a fixed cost per command, not a multiple of the line: the allowance is absolute, well under "+
			"what a person at a prompt notices and under one info round trip to a TCG guest).",
			cfg.rounds, cfg.perRound, execSlack, execFrames, report.Fmt(sessionAllowance)),
		Header: []string{"round trip", "p50", "p99", "p50 / info"},
	}
	info := samples[0].Quantile(0.5)
	for i, m := range measures {
		p50 := samples[i].Quantile(0.5)
		sec.AddRow(m.name, report.Fmt(p50), report.Fmt(samples[i].Quantile(0.99)), fmt.Sprintf("%.1fx", float64(p50)/float64(info)))
	}
	guestNote := "The QEMU guest's rows: the real agent (sbx-agent) in a 256 MiB TCG guest (busybox sh), reached over QEMU's port forward after the key handshake; " +
		fmt.Sprintf("%d rounds of %d samples.", cfg.guestRounds, cfg.perRound)
	if gs, err := measureGuest(ctx, dir, cfg); err != nil {
		guestNote = "The QEMU guest's rows were not measured: " + err.Error()
	} else {
		ginfo := gs[0].Quantile(0.5)
		for i, name := range guestMeasures {
			p50 := gs[i].Quantile(0.5)
			sec.AddRow(name+" (QEMU TCG guest)", report.Fmt(p50), report.Fmt(gs[i].Quantile(0.99)), fmt.Sprintf("%.1fx (of its info)", float64(p50)/float64(ginfo)))
		}
	}
	execOver := samples[1].Quantile(0.5) - samples[2].Quantile(0.5)
	sessOver := samples[3].Quantile(0.5) - samples[4].Quantile(0.5)
	execT := execTarget(samples[2].Quantile(0.5), info)
	sec.Verdict(samples[1].Quantile(0.5) <= execT, "exec true p50 %s, fork+exec+wait %s, info %s (target <= %s: the floor's p50 x %.1f plus %d info round trips)",
		report.Fmt(samples[1].Quantile(0.5)), report.Fmt(samples[2].Quantile(0.5)), report.Fmt(info), report.Fmt(execT), execSlack, execFrames)
	sessT := sessionTarget(samples[4].Quantile(0.5))
	sec.Verdict(samples[3].Quantile(0.5) <= sessT, "session command p50 %s, bare shell line %s (target <= %s: the line plus %s)",
		report.Fmt(samples[3].Quantile(0.5)), report.Fmt(samples[4].Quantile(0.5)), report.Fmt(sessT), report.Fmt(sessionAllowance))
	signed := func(d time.Duration) string {
		if d < 0 {
			return "-" + report.Fmt(-d)
		}
		return "+" + report.Fmt(d)
	}
	sec.Notes = append(sec.Notes, guestNote,
		fmt.Sprintf("p50 against the OS floors: exec true %s over a fork+exec+wait of true by os/exec (which also opens /dev/null for its stdio); a session command %s over a bare shell line.",
			signed(execOver), signed(sessOver)),
		fmt.Sprintf("%d CPUs; load average %s at the start, %s at the end.", runtime.NumCPU(), loadStart, report.LoadAvg()))
	return sec, nil
}

// What an RPC may add to the OS work it cannot avoid, in units of that
// work and of the protocol's own round trip (info's p50).
const (
	// An exec is its request and two replies (started, exit) around the
	// same fork+exec+wait the floor does (OSProcs runs os/exec too): two
	// round trips' worth of frames, and a tenth of the floor for the
	// agent's pipes and reaper and the floor's own run-to-run noise.
	execFrames = 2
	execSlack  = 1.1
	// A session command is a script, not a line: the command in a { }
	// group with its stdin from /dev/null, then the nonce marker's printf
	// of its status, which the shell reads from its pipe (bash a byte at a
	// time) and the agent frames as a request and its replies. Those are a
	// fixed cost per command, not a multiple of the bare line, so the
	// target is an absolute allowance: half a millisecond, well under what
	// a person at a prompt notices and under one info round trip to a TCG
	// guest.
	sessionAllowance = 500 * time.Microsecond
)

// execTarget is the p50 an exec may take given its floors' p50s.
func execTarget(forkExec, info time.Duration) time.Duration {
	return time.Duration(float64(forkExec)*execSlack) + execFrames*info
}

// sessionTarget is the p50 a session command may take given its floor's
// p50.
func sessionTarget(shellLine time.Duration) time.Duration {
	return shellLine + sessionAllowance
}

// exitZero is an exec's error, or one for an exit code that is not 0.
func exitZero(r silkd.ExecResult, err error) error {
	if err == nil && r.Code != 0 {
		err = fmt.Errorf("exit %d", r.Code)
	}
	return err
}

// bareShell is sh with pipes: the floor of a session's command.
type bareShell struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startBareShell starts the shell a session's is: bash where there is one,
// else sh.
func startBareShell() (*bareShell, error) {
	shell := "sh"
	if _, err := exec.LookPath("bash"); err == nil {
		shell = "bash"
	}
	cmd := exec.Command(shell)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &bareShell{cmd: cmd, in: in, out: bufio.NewReader(out)}, nil
}

func (b *bareShell) roundTrip() error {
	if _, err := io.WriteString(b.in, "echo x\n"); err != nil {
		return err
	}
	line, err := b.out.ReadBytes('\n')
	if err == nil && !bytes.Equal(line, []byte("x\n")) {
		err = fmt.Errorf("the shell answered %q", line)
	}
	return err
}

func (b *bareShell) close() {
	b.in.Close()
	_ = b.cmd.Wait()
}
