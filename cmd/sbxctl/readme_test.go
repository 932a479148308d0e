package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeCommands returns every sbxctl command line README.md shows: the
// lines of its sh blocks and its inline `sbxctl ...` spans, without the
// leading "bin/" and the trailing comment.
func readmeCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	add := func(s string) {
		s, _, _ = strings.Cut(s, "#")
		s = strings.TrimSpace(s)
		if i := strings.Index(s, "sbxctl "); i >= 0 && (i == 0 || strings.HasSuffix(s[:i], "bin/") || strings.HasSuffix(s[:i], "<(")) {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(s[i+len("sbxctl "):]), ")"))
		}
	}
	inBlock := false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "```"):
			inBlock = !inBlock && strings.TrimPrefix(l, "```") == "sh"
		case inBlock:
			add(strings.TrimPrefix(l, "sudo "))
		default:
			for _, m := range regexp.MustCompile("`((?:bin/)?sbxctl [^`]+)`").FindAllStringSubmatch(l, -1) {
				add(m[1])
			}
		}
	}
	return out
}

// Every sbxctl command README.md shows exists, and every flag it passes
// is one the command defines (its help lists it): the README is what a
// new user types first.
func TestReadmeCommandsExist(t *testing.T) {
	lines := readmeCommands(t)
	if len(lines) < 15 {
		t.Fatalf("found only %d sbxctl lines in README.md: %q", len(lines), lines)
	}
	for _, line := range lines {
		args := strings.Fields(line)
		if args[0] == "--version" || args[0] == "help" {
			args = args[1:]
			if len(args) == 0 {
				continue
			}
		}
		name, _, rest, ok := lookup(args)
		if !ok {
			t.Errorf("README: sbxctl %s: no command %q", line, name)
			continue
		}
		_, _, help := sbx("help", name)
		for _, a := range rest {
			if a == "--" {
				break
			}
			if !strings.HasPrefix(a, "-") || a == "-" {
				continue
			}
			flag, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(flag) + `(\s|$)`).MatchString(help) {
				t.Errorf("README: sbxctl %s: %s has no flag -%s", line, name, flag)
			}
		}
	}
}
