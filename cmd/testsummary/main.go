// Command testsummary reads `go test -json` on standard input and prints
// what a person running `make test` needs: each package's result line as
// `go test` prints it, the output of every failed test, and at the end
// every skipped test grouped by its reason (plain `go test` shows skips
// only with -v, where they drown in the log), with the counts and how long
// the run took. It exits 1 when a test or package failed or the input held
// no result at all.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Output  string
}

func main() { os.Exit(summarize(os.Stdin, os.Stdout)) }

type testKey struct{ pkg, test string }

// summary holds a run's state while its events stream in.
type summary struct {
	out                              io.Writer
	buf                              map[testKey][]string // a running test's output
	skips                            map[string][]testKey // reason -> skipped tests
	passed, failed, pkgs, pkgsFailed int
	first, last                      time.Time
}

func summarize(in io.Reader, out io.Writer) int {
	s := &summary{out: out, buf: map[testKey][]string{}, skips: map[string][]testKey{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not an event: a build error, pass it on
			continue
		}
		s.add(e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testsummary: reading go test -json: %v\n", err)
		return 1
	}
	return s.report()
}

func (s *summary) add(e event) {
	if !e.Time.IsZero() {
		if s.first.IsZero() {
			s.first = e.Time
		}
		s.last = e.Time
	}
	k := testKey{e.Package, e.Test}
	switch {
	case e.Test == "" && e.Action == "output":
		// The package's own lines: ok/FAIL/? and what the binary printed
		// outside any test; the bare PASS/FAIL of the test binary is noise.
		if t := strings.TrimSpace(e.Output); t != "PASS" && t != "FAIL" {
			fmt.Fprint(s.out, e.Output)
		}
	case e.Action == "build-output":
		// go test -json's compiler errors (Go 1.24 on) are events too.
		fmt.Fprint(s.out, e.Output)
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
		s.pkgs++
		if e.Action == "fail" {
			s.pkgsFailed++
			s.flushUnfinished(e.Package)
		}
	case e.Action == "output":
		s.buf[k] = append(s.buf[k], e.Output)
	case e.Action == "pass":
		s.passed++
		delete(s.buf, k)
	case e.Action == "fail":
		s.failed++
		fmt.Fprint(s.out, strings.Join(s.buf[k], ""))
		delete(s.buf, k)
	case e.Action == "skip":
		reason := skipReason(s.buf[k])
		s.skips[reason] = append(s.skips[reason], k)
		delete(s.buf, k)
	}
}

// flushUnfinished prints the output of pkg's tests that never ended: a
// panic or the -timeout killed the binary while they ran, and what they
// printed is what says why.
func (s *summary) flushUnfinished(pkg string) {
	var ks []testKey
	for k := range s.buf {
		if k.pkg == pkg && k.test != "" {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, func(a, b testKey) int { return strings.Compare(a.test, b.test) })
	for _, k := range ks {
		fmt.Fprintf(s.out, "--- unfinished: %s\n%s", k.test, strings.Join(s.buf[k], ""))
		delete(s.buf, k)
	}
}

// skipReason is what the test said when it skipped: its output less the
// framework's own lines and the file:line prefix.
func skipReason(lines []string) string {
	var r []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		if _, msg, ok := strings.Cut(t, ": "); ok && strings.Contains(t[:len(t)-len(msg)], ".go:") {
			t = msg
		}
		r = append(r, t)
	}
	if len(r) == 0 {
		return "(no reason given)"
	}
	return strings.Join(r, " ")
}

func (s *summary) report() int {
	if s.pkgs == 0 {
		fmt.Fprintln(s.out, "testsummary: no package result in the input")
		return 1
	}
	reasons := make([]string, 0, len(s.skips))
	skipped := 0
	for r, ks := range s.skips {
		reasons = append(reasons, r)
		skipped += len(ks)
	}
	slices.Sort(reasons)
	if skipped > 0 {
		fmt.Fprintf(s.out, "\nskipped (%d tests):\n", skipped)
	}
	for _, r := range reasons {
		ks := s.skips[r]
		fmt.Fprintf(s.out, "  %s\n", r)
		byPkg := map[string][]string{}
		var pkgs []string
		for _, k := range ks {
			if _, ok := byPkg[k.pkg]; !ok {
				pkgs = append(pkgs, k.pkg)
			}
			byPkg[k.pkg] = append(byPkg[k.pkg], k.test)
		}
		slices.Sort(pkgs)
		for _, p := range pkgs {
			fmt.Fprintf(s.out, "    %s: %s\n", p, strings.Join(byPkg[p], " "))
		}
	}
	fmt.Fprintf(s.out, "\n%d packages (%d failed): %d tests passed, %d skipped, %d failed in %s\n",
		s.pkgs, s.pkgsFailed, s.passed, skipped, s.failed, s.last.Sub(s.first).Round(time.Second))
	if s.failed+s.pkgsFailed > 0 {
		return 1
	}
	return 0
}
