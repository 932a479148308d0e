// Command sbxctl is the operator's CLI for sbxlog: it inspects and replays op
// logs offline and talks to a running sandboxd over its HTTP API.
//
// Each subcommand lives in its own file and registers itself in commands; the
// dispatcher here only routes. Exit codes: 0 success, 1 the command ran and
// found a problem (e.g. a log that fails verification), 2 bad usage.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// command is one subcommand. Its name may have two words ("log dump").
type command struct {
	summary string
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
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	// Longest match first: "log dump" before "log".
	if len(args) >= 2 {
		if c, ok := commands[args[0]+" "+args[1]]; ok {
			return c.run(args[2:], stdout, stderr)
		}
	}
	if c, ok := commands[args[0]]; ok {
		return c.run(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "sbxctl: unknown command %q\n\n", strings.Join(args[:min(2, len(args))], " "))
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sbxctl <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-16s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'sbxctl <command> -h' for a command's flags.")
}
