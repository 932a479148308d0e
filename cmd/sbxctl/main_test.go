package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestDispatchUnknownAndHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"no-such"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown command") {
		t.Fatalf("unknown command: code %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := dispatch([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "usage: sbxctl") {
		t.Fatalf("help: code %d, stderr %q", code, errb.String())
	}
}

func TestDispatchTwoWordCommand(t *testing.T) {
	var got []string
	register("test-x y", command{summary: "t", run: func(args []string, _, _ io.Writer) int { got = args; return 7 }})
	t.Cleanup(func() { delete(commands, "test-x y") })
	if code := dispatch([]string{"test-x", "y", "a"}, io.Discard, io.Discard); code != 7 || len(got) != 1 || got[0] != "a" {
		t.Fatalf("code %d args %v", code, got)
	}
}

// Every command answers help NAME and NAME -h alike: its own usage line,
// its flags, and examples (issue 25 item 10: help claim printed the global
// help, no -h had examples).
func TestHelpOfEveryCommand(t *testing.T) {
	for _, name := range commandNames() {
		t.Run(name, func(t *testing.T) {
			for _, args := range [][]string{
				append([]string{"help"}, strings.Fields(name)...),
				append(strings.Fields(name), "-h"),
			} {
				code, out, errs := sbx(args...)
				if code != 0 || out != "" || !strings.HasPrefix(errs, "sbxctl "+name+": "+commands[name].summary) ||
					!strings.Contains(strings.ToLower(errs), "usage") || !strings.Contains(errs, "\nexamples:\n  ") || !strings.Contains(errs, "sbxctl "+name+" ") {
					t.Fatalf("%q: exit %d, stdout %q, stderr:\n%s", args, code, out, errs)
				}
				if strings.Contains(errs, "commands:") {
					t.Fatalf("%q printed the global help:\n%s", args, errs)
				}
			}
		})
	}
	// After "--" a -h is the guest command's.
	if !asksHelp([]string{"ID", "-h"}) || asksHelp([]string{"ID", "--", "ls", "-h"}) {
		t.Fatal("asksHelp")
	}
	if code, _, errs := sbx("help", "no-such"); code != 2 || !strings.Contains(errs, "unknown command") {
		t.Fatalf("help no-such: exit %d, %q", code, errs)
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		code, out, _ := sbx(arg)
		if code != 0 || !strings.HasPrefix(out, "sbxctl ") || !strings.Contains(out, "revision ") || !strings.Contains(out, "built with go") {
			t.Fatalf("%s: exit %d, %q", arg, code, out)
		}
	}
}
