// Command bench runs the project's benchmark sections, prints each as a table and
// writes the figures of record into docs/benchmarks.md (see `make bench`).
//
// Each section lives in its own package under bench/ and is listed in sections
// below; a section measures the project's code and, in the same run, the floor or
// comparator the issue names, so every ratio in the document compares figures
// taken minutes apart on the same machine.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sbxlog/sbxlog/bench/agentbench"
	"github.com/sbxlog/sbxlog/bench/apibench"
	"github.com/sbxlog/sbxlog/bench/chbench"
	"github.com/sbxlog/sbxlog/bench/ckptbench"
	"github.com/sbxlog/sbxlog/bench/diskbench"
	"github.com/sbxlog/sbxlog/bench/egressbench"
	"github.com/sbxlog/sbxlog/bench/execbench"
	"github.com/sbxlog/sbxlog/bench/fsmbench"
	"github.com/sbxlog/sbxlog/bench/logbench"
	"github.com/sbxlog/sbxlog/bench/qemubench"
	"github.com/sbxlog/sbxlog/bench/relaybench"
	"github.com/sbxlog/sbxlog/bench/replbench"
	"github.com/sbxlog/sbxlog/bench/report"
	"github.com/sbxlog/sbxlog/bench/restartbench"
	"github.com/sbxlog/sbxlog/bench/tarbench"
)

// section is one runnable benchmark.
type section struct {
	name string
	run  func(ctx context.Context, opts Options) (*report.Section, error)
}

// Options are shared by all sections.
type Options = report.Options

var sections = []section{
	{"logbench", logbench.Run},
	{"fsmbench", fsmbench.Run},
	{"chbench", chbench.Run},
	{"execbench", execbench.Run},
	{"apibench", apibench.Run},
	{"qemubench", qemubench.Run},
	{"replbench", replbench.Run},
	{"restartbench", restartbench.Run},
	{"relaybench", relaybench.Run},
	{"egressbench", egressbench.Run},
	{"tarbench", tarbench.Run},
	{"agentbench", agentbench.Run},
	{"egressqemubench", egressbench.RunQEMU},
	{"genbench", diskbench.Run},
	{"archivebench", diskbench.RunArchive},
	{"fleetbench", replbench.RunFleet},
	{"pausebench", ckptbench.RunPause},
	{"forkbench", ckptbench.RunFork},
}

func main() {
	out := flag.String("out", "docs/benchmarks.md", "markdown file to splice the figures into (empty: print only)")
	only := flag.String("only", "", "comma-separated section names to run (default all)")
	quick := flag.Bool("quick", false, "smaller sample counts, for a smoke run")
	scratch := flag.String("scratch", "", "scratch directory (default a temp dir)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	want := map[string]bool{}
	for _, n := range strings.Split(*only, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	dir := *scratch
	if dir == "" {
		d, err := os.MkdirTemp("", "sbxbench-")
		if err != nil {
			fatal(err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	opts := Options{Quick: *quick, Scratch: dir}

	var done []*report.Section
	var failed []string
	for _, s := range sections {
		if len(want) > 0 && !want[s.name] {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: running %s\n", s.name)
		start := time.Now()
		sec, err := s.run(ctx, opts)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s failed: %v\n", s.name, err)
			failed = append(failed, s.name)
			continue
		}
		sec.Name = s.name
		// Sections may come from different runs (BENCH=name reruns one):
		// each says when it was measured.
		sec.Notes = append(sec.Notes, fmt.Sprintf("Measured %s to %s UTC.", start.UTC().Format("2006-01-02 15:04"), time.Now().UTC().Format("15:04")))
		sec.Text(os.Stdout)
		fmt.Fprintf(os.Stderr, "bench: %s took %s\n", s.name, time.Since(start).Round(time.Millisecond))
		done = append(done, sec)
	}
	if *out != "" && len(done) > 0 {
		old, err := os.ReadFile(*out)
		if err != nil && !os.IsNotExist(err) {
			fatal(err)
		}
		if err := os.WriteFile(*out, report.Splice(old, report.Machine(time.Now(), sectionNames(done, len(want) > 0), string(old)), done), 0o644); err != nil {
			fatal(err)
		}
		fmt.Fprintf(os.Stderr, "bench: wrote %d section(s) to %s\n", len(done), *out)
	}
	if len(failed) > 0 {
		fatal(fmt.Errorf("sections failed: %s", strings.Join(failed, ", ")))
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// sectionNames lists the sections of a partial run for the machine line; a
// full run lists none.
func sectionNames(done []*report.Section, partial bool) []string {
	if !partial {
		return nil
	}
	var names []string
	for _, s := range done {
		names = append(names, s.Name)
	}
	return names
}
