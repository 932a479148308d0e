package main

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// ps, logs, sessions and exec --session on the simulated guest; exec -t
// is refused there, saying why.
func TestProcCommands(t *testing.T) {
	startNode(t, 1)
	cl := claimOne(t)
	// with puts the sandbox's token after the command's name (before --).
	with := func(args []string) []string {
		return append([]string{args[0], "--sandbox-token", cl.Token}, args[1:]...)
	}
	run := func(args ...string) string {
		t.Helper()
		setStdin(t, strings.NewReader(""))
		code, out, errs := sbx(with(args)...)
		if code != 0 {
			t.Fatalf("sbxctl %s: exit %d, %s", strings.Join(args, " "), code, errs)
		}
		return out
	}

	// A session: cd and export in one exec, seen by the next.
	sid := strings.TrimSpace(run("sessions", cl.ID, "--new", "--env", "GREETING=hi"))
	if !strings.HasPrefix(sid, "sess-") {
		t.Fatalf("sessions --new printed %q", sid)
	}
	run("exec", cl.ID, "--session", sid, "--", "eval", "cd /tmp && export X=1")
	if out := run("exec", cl.ID, "--session", sid, "--", "eval", "pwd; echo $X $GREETING"); out != "/tmp\n1 hi\n" {
		t.Fatalf("the session's second exec printed %q", out)
	}
	if out := run("sessions", cl.ID); out != sid+"\n" {
		t.Fatalf("sessions = %q", out)
	}
	run("sessions", cl.ID, "--rm", sid)
	if out := run("sessions", cl.ID); out != "" {
		t.Fatalf("sessions after --rm = %q", out)
	}

	// A foreground exec, then ps and logs of it.
	run("exec", cl.ID, "--", "echo", "counted")
	var procs []silkd.Proc
	mustJSON(t, &procs, with([]string{"ps", cl.ID})...)
	if len(procs) != 1 || procs[0].State != "exited" || procs[0].Argv[0] != "echo" {
		t.Fatalf("ps = %+v", procs)
	}
	pid := strconv.Itoa(int(procs[0].Pid))
	if out := run("ps", cl.ID); !strings.Contains(out, pid+"  ") || !strings.Contains(out, "echo counted") {
		t.Fatalf("ps table:\n%s", out)
	}
	if out := run("logs", cl.ID, pid); out != "counted\n" {
		t.Fatalf("logs = %q", out)
	}
	if out := run("logs", "-f", cl.ID, pid); out != "counted\n" {
		t.Fatalf("logs -f = %q", out)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"logs of an unknown pid", []string{"logs", cl.ID, "123456"}, 1, "not_found"},
		{"a pid that is not one", []string{"logs", cl.ID, "x"}, 2, "want a process id"},
		{"-t with --session", []string{"exec", "-t", "--session", "s", cl.ID, "--", "sh"}, 2, "exclude"},
		{"-t on the simulated guest", []string{"exec", "-t", cl.ID, "--", "sh"}, 1, "simulates"},
		{"-it with --session", []string{"exec", "-it", "--session", "s", cl.ID, "--", "sh"}, 2, "exclude"},
		{"-it=maybe", []string{"exec", "-it=maybe", cl.ID, "--", "sh"}, 2, "invalid boolean"},
		{"session_rm of an unknown session", []string{"sessions", cl.ID, "--rm", "nope"}, 1, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setStdin(t, strings.NewReader(""))
			code, _, errs := sbx(with(tc.args)...)
			if code != tc.code || !strings.Contains(errs, tc.err) {
				t.Fatalf("exit %d, stderr %q; want %d, %q", code, errs, tc.code, tc.err)
			}
		})
	}
}

// exec -t on a guest with terminals: the engine of the real agent on the
// host's processes stands in for the guest. Standard input that is not a
// terminal gives the default 80x24; the command's exit code comes through.
func TestExecTerminal(t *testing.T) {
	n := startNode(t, 1)
	agent := &silkagent.Server{Procs: silkagent.OSProcs{}}
	n.Driver.SetAgent(func(conn net.Conn, _ string) {
		defer conn.Close()
		agent.ServeConn(conn)
	})
	cl := claimOne(t)
	// -it is what a docker user types: -i and -t at once.
	for _, flag := range []string{"-t", "-it"} {
		setStdin(t, strings.NewReader(""))
		code, out, errs := sbx("exec", flag, "--sandbox-token", cl.Token, cl.ID, "--", "sh", "-c", "stty size; echo a'b'c; exit 3")
		if code != 3 || !strings.Contains(out, "24 80\r\nabc\r\n") {
			t.Fatalf("exec %s: exit %d, stdout %q, stderr %q; want 3 and the terminal's size", flag, code, out, errs)
		}
	}
}
