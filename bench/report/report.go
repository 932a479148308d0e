// Package report is the shared shape of a benchmark section: a titled table with
// the method that produced it, and the code that prints it and splices it into
// docs/benchmarks.md. Each section owns one marked block of that file, so running
// a subset of sections rewrites only their blocks and keeps the others' figures.
package report

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// Section is one benchmark's figures of record.
type Section struct {
	// Name is the stable key of the section's block in docs/benchmarks.md.
	Name string
	// Title is the heading shown to readers.
	Title string
	// Method says how the figures were taken, in prose: what ran, how often,
	// against which comparator.
	Method string
	// Header and Rows form the table.
	Header []string
	Rows   [][]string
	// Verdicts are one line each: a target from an issue and whether it held,
	// with the figures that decide it.
	Verdicts []string
	// Notes are free lines printed under the table.
	Notes []string
}

// AddRow appends a row; cells are formatted with %v.
func (s *Section) AddRow(cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		row[i] = fmt.Sprint(c)
	}
	s.Rows = append(s.Rows, row)
}

// Verdict records whether target held, e.g. Verdict(ok, "p50 %.1fx of floor (target <= 1.3x)", r).
func (s *Section) Verdict(ok bool, format string, args ...any) {
	mark := "PASS"
	if !ok {
		mark = "MISS"
	}
	s.Verdicts = append(s.Verdicts, mark+": "+fmt.Sprintf(format, args...))
}

// Markdown renders the section as a markdown block.
func (s *Section) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s\n\n", s.Title)
	if s.Method != "" {
		fmt.Fprintf(&b, "%s\n\n", strings.TrimSpace(s.Method))
	}
	if len(s.Header) > 0 {
		b.WriteString("| " + strings.Join(s.Header, " | ") + " |\n")
		seps := make([]string, len(s.Header))
		for i := range seps {
			seps[i] = "---"
		}
		b.WriteString("|" + strings.Join(seps, "|") + "|\n")
		for _, r := range s.Rows {
			b.WriteString("| " + strings.Join(r, " | ") + " |\n")
		}
		b.WriteString("\n")
	}
	for _, v := range s.Verdicts {
		fmt.Fprintf(&b, "- %s\n", v)
	}
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

// Text renders the section for a terminal.
func (s *Section) Text(w io.Writer) {
	fmt.Fprintf(w, "\n== %s ==\n", s.Title)
	widths := make([]int, len(s.Header))
	for i, h := range s.Header {
		widths[i] = len(h)
	}
	for _, r := range s.Rows {
		for i, c := range r {
			if i < len(widths) && len(c) > widths[i] {
				widths[i] = len(c)
			}
		}
	}
	line := func(cells []string) {
		for i, c := range cells {
			if i < len(widths) {
				fmt.Fprintf(w, "%-*s  ", widths[i], c)
			}
		}
		fmt.Fprintln(w)
	}
	line(s.Header)
	for _, r := range s.Rows {
		line(r)
	}
	for _, v := range s.Verdicts {
		fmt.Fprintf(w, "  %s\n", v)
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

const (
	beginMark = "<!-- begin section:%s -->"
	endMark   = "<!-- end section:%s -->"
	machineB  = "<!-- begin machine -->"
	machineE  = "<!-- end machine -->"
)

// Splice rewrites the blocks of the given sections in the markdown document doc
// (creating the document or a missing block as needed) and refreshes the machine
// description. Blocks of sections not given are kept as they are.
func Splice(doc []byte, machine string, sections []*Section) []byte {
	text := string(doc)
	if strings.TrimSpace(text) == "" {
		text = "# Benchmarks: figures of record\n\n" +
			"Written by `make bench` (`go run ./bench`); do not edit the marked blocks by hand.\n" +
			"Each section states its method and the comparator measured in the same run.\n\n" +
			machineB + "\n" + machineE + "\n"
	}
	text = replaceBlock(text, machineB, machineE, machine)
	for _, s := range sections {
		text = replaceBlock(text, fmt.Sprintf(beginMark, s.Name), fmt.Sprintf(endMark, s.Name), s.Markdown())
	}
	return []byte(text)
}

func replaceBlock(text, begin, end, body string) string {
	block := begin + "\n" + strings.TrimRight(body, "\n") + "\n" + end
	i := strings.Index(text, begin)
	j := strings.Index(text, end)
	if i < 0 || j < i {
		return strings.TrimRight(text, "\n") + "\n\n" + block + "\n"
	}
	return text[:i] + block + text[j+len(end):]
}

// Machine describes the host the run measured, for the document's header.
// A partial run (only: the sections it ran) keeps the time of the last full
// run from prev, the document as it was.
func Machine(now time.Time, only []string, prev string) string {
	var b bytes.Buffer
	stamp := now.UTC().Format(time.RFC3339)
	if len(only) == 0 {
		fmt.Fprintf(&b, "Last run: %s", stamp)
	} else {
		full := "unknown"
		if m := lastFullRun.FindStringSubmatch(prev); m != nil {
			full = m[1]
		}
		names := slices.Clone(only)
		if m := rerunSince.FindStringSubmatch(prev); m != nil {
			names = append(names, strings.Split(m[1], ", ")...)
		}
		slices.Sort(names)
		fmt.Fprintf(&b, "Last full run: %s; rerun since: %s (last at %s)", full, strings.Join(slices.Compact(names), ", "), stamp)
	}
	fmt.Fprintf(&b, ", %s %s/%s, %d CPUs", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if cpu := cpuModel(); cpu != "" {
		fmt.Fprintf(&b, ", %s", cpu)
	}
	if mem := memTotal(); mem != "" {
		fmt.Fprintf(&b, ", %s RAM", mem)
	}
	b.WriteString(".\n")
	return b.String()
}

// lastFullRun finds the time of the last full run in a machine line.
var lastFullRun = regexp.MustCompile(`Last (?:full )?run: ([0-9T:Z-]+)`)

// rerunSince finds the sections rerun since the last full run.
var rerunSince = regexp.MustCompile(`rerun since: ([a-z0-9, ]+?) \(`)

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func memTotal() string {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "MemTotal:") {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "MemTotal:")), "%d", &kb)
			return fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
		}
	}
	return ""
}

// Durations summarises latency samples.
type Durations []time.Duration

// Quantile returns the q-quantile (0 < q <= 1) by nearest rank, ceil(q*n)-th
// smallest; zero for no samples.
func (d Durations) Quantile(q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append(Durations(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(math.Ceil(q*float64(len(s)))) - 1
	idx = max(0, min(idx, len(s)-1))
	return s[idx]
}

// Fmt formats a duration with three significant figures in a fixed unit family.
func Fmt(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.3f s", d.Seconds())
	}
}

// FmtDelta formats a difference of durations with its sign: "+1.2 µs",
// "-3.5 µs" (Fmt alone would print a negative one in nanoseconds).
func FmtDelta(d time.Duration) string {
	if d < 0 {
		return "-" + Fmt(-d)
	}
	return "+" + Fmt(d)
}

// Options are passed to every section's run function.
type Options struct {
	// Quick asks for small sample counts (a smoke run, not figures of record).
	Quick bool
	// Scratch is a directory the section may fill; it is removed after the run.
	Scratch string
}

// Dir makes the section's own empty directory name under Scratch, or a
// temp dir when there is no Scratch (a section run alone, as its tests
// do). done removes the temp dir; what is under Scratch goes with it.
func (o Options) Dir(name string) (dir string, done func(), err error) {
	if o.Scratch == "" {
		d, err := os.MkdirTemp("", name)
		if err != nil {
			return "", nil, err
		}
		return d, func() { os.RemoveAll(d) }, nil
	}
	dir = filepath.Join(o.Scratch, name)
	if err := os.RemoveAll(dir); err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	return dir, func() {}, nil
}

// LoadAvg is /proc/loadavg's 1, 5 and 15 minute figures ("unknown" where
// it cannot be read): how busy the host was while a section measured.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
