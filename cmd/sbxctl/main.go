// Command sbxctl is the operator's CLI for sbxlog: it inspects and replays op
// logs offline and talks to a running sandboxd over its HTTP API.
//
// Each subcommand lives in its own file and declares itself in one
// register call: its name (one or two words), a one-line summary, examples
// (shown by -h and `sbxctl help NAME`) and its run function (remoteCommand
// for the commands that talk to sandboxd). The dispatcher here only routes,
// and answers --version, help and completion from that one table. Exit
// codes: 0 success, 1 the command ran and found a problem (e.g. a log that
// fails verification), 2 bad usage; exec passes on its command's.
package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/sbxlog/sbxlog/cmd/buildinfo"
)

// command is one subcommand. Its name may have two words ("log dump").
type command struct {
	summary string
	// examples are command lines with what they do, one per line
	// ("sbxctl claim --template default   # a sandbox of pool default"),
	// printed after the flags by -h.
	examples string
	// run executes the command with the arguments after its name. It returns
	// the process exit code.
	run func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

func register(name string, c command) {
	if _, dup := commands[name]; dup {
		panic("sbxctl: duplicate command " + name)
	}
	commands[name] = c
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stderr)
		return 0
	case "--version", "-version", "version":
		fmt.Fprintln(stdout, buildinfo.Read().Line("sbxctl"))
		return 0
	case "help":
		if len(args) == 1 {
			usage(stderr)
			return 0
		}
		// help NAME: the command's own -h.
		name, c, _, ok := lookup(args[1:])
		if !ok {
			return unknown(args[1:], stderr)
		}
		return help(name, c, stderr)
	}
	name, c, rest, ok := lookup(args)
	if !ok {
		return unknown(args, stderr)
	}
	if asksHelp(rest) {
		return help(name, c, stderr)
	}
	return c.run(rest, stdout, stderr)
}

// lookup finds the command args start with, the longest name first ("log
// dump" before "log"), and the arguments after its name.
func lookup(args []string) (name string, c command, rest []string, ok bool) {
	if len(args) >= 2 {
		if c, ok := commands[args[0]+" "+args[1]]; ok {
			return args[0] + " " + args[1], c, args[2:], true
		}
	}
	c, ok = commands[args[0]]
	return args[0], c, args[1:], ok
}

func unknown(args []string, stderr io.Writer) int {
	fmt.Fprintf(stderr, "sbxctl: unknown command %q\n\n", strings.Join(args[:min(2, len(args))], " "))
	usage(stderr)
	return 2
}

// asksHelp says whether args ask for help before any "--" (after it they
// are the guest command's: exec ID -- ls -h).
func asksHelp(args []string) bool {
	if i := slices.Index(args, "--"); i >= 0 {
		args = args[:i]
	}
	return slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "-help" || a == "--help" })
}

// help prints a command's usage and flags (its own -h) and its examples.
func help(name string, c command, stderr io.Writer) int {
	fmt.Fprintf(stderr, "sbxctl %s: %s\n\n", name, c.summary)
	c.run([]string{"-h"}, io.Discard, stderr)
	if c.examples != "" {
		fmt.Fprintln(stderr, "\nexamples:")
		for _, l := range strings.Split(strings.TrimSpace(c.examples), "\n") {
			fmt.Fprintln(stderr, "  "+strings.TrimSpace(l))
		}
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sbxctl <command> [flags]\n\ncommands:")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-16s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'sbxctl help <command>' (or 'sbxctl <command> -h') for a command's flags and examples;")
	fmt.Fprintln(w, "'sbxctl --version' for the build; 'sbxctl completion bash|zsh' for shell completion.")
}

// commandNames lists the commands, sorted.
func commandNames() []string { return slices.Sorted(maps.Keys(commands)) }
