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
