package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFrom(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want Info
	}{
		{"git checkout", debug.BuildInfo{GoVersion: "go1.24.1", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "false"}}},
			Info{Version: "(devel)", Revision: "abc123", Time: "2026-12-01T10:00:00Z", Go: "go1.24.1"}},
		{"dirty tree", debug.BuildInfo{GoVersion: "go1.24.1", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}},
			Info{Version: "v1.2.3", Revision: "abc123-dirty", Time: "unknown", Go: "go1.24.1"}},
		{"no vcs stamp", debug.BuildInfo{}, Info{Version: "unknown", Revision: "unknown", Time: "unknown", Go: "unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := From(&tc.bi); got != tc.want {
				t.Fatalf("From = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The test binary itself has build info: Read finds the toolchain.
func TestReadAndLine(t *testing.T) {
	in := Read()
	if !strings.HasPrefix(in.Go, "go") {
		t.Fatalf("Read().Go = %q", in.Go)
	}
	if l := in.Line("sbxctl"); !strings.HasPrefix(l, "sbxctl ") || !strings.Contains(l, "revision "+in.Revision) {
		t.Fatalf("Line = %q", l)
	}
}
