// Package buildinfo says which build a binary is: its module version and
// the VCS revision Go stamped into it (runtime/debug.ReadBuildInfo), so
// `sandboxd --version`, `sbxctl --version` and sandboxd's build-info metric
// all read the same facts and nobody has to pass -ldflags to get them.
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// Info is what a binary knows about its own build. A field Go did not
// stamp (go run, a build outside a git checkout, -buildvcs=false) is
// "unknown", never empty, so every label and line has a value.
type Info struct {
	// Version is the main module's version: a tag when built from one
	// (go install …@v1.2.3), else "(devel)".
	Version string
	// Revision is the VCS commit, with "-dirty" when the tree had
	// uncommitted changes; Time is that commit's time.
	Revision string
	Time     string
	// Go is the toolchain that built the binary.
	Go string
}

const unknown = "unknown"

// Read reads the running binary's build info.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: unknown, Revision: unknown, Time: unknown, Go: unknown}
	}
	return From(bi)
}

// From extracts Info from bi (Read's work, separate so tests can feed it).
func From(bi *debug.BuildInfo) Info {
	in := Info{Version: or(bi.Main.Version), Revision: unknown, Time: unknown, Go: or(bi.GoVersion)}
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = or(s.Value)
		case "vcs.time":
			in.Time = or(s.Value)
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && in.Revision != unknown {
		in.Revision += "-dirty"
	}
	return in
}

func or(s string) string {
	if s == "" {
		return unknown
	}
	return s
}

// Line is the --version line of program prog.
func (in Info) Line(prog string) string {
	return fmt.Sprintf("%s %s (revision %s, %s, built with %s)", prog, in.Version, in.Revision, in.Time, in.Go)
}
