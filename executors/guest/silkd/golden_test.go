package silkd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The golden frames in testdata/fixtures/v1 are the protocol's reference
// fixtures, byte for byte (req_exec_older.json is the older req_exec,
// without session). Every one must decode to its typed frame and encode
// back to the same bytes: a frame only one direction round-trips is
// protocol drift.

func fixtures(t *testing.T, prefix string) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "fixtures", "v1", prefix+"*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no %s fixtures (%v)", prefix, err)
	}
	out := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(b, []byte("\n")) || bytes.Count(b, []byte("\n")) != 1 {
			t.Fatalf("%s: a fixture is one line ending in a newline", p)
		}
		out[strings.TrimSuffix(filepath.Base(p), ".json")] = b
	}
	return out
}

func i32(v int32) *int32   { return &v }
func u32(v uint32) *uint32 { return &v }
func env(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// wantRequests is what each request fixture means.
var wantRequests = map[string]Request{
	"req_info":           &Info{},
	"req_exec":           &Exec{Argv: []string{"python3", "-c", "print(40+2)"}, Cwd: "/workspace", Env: env("PYTHONUNBUFFERED", "1"), User: "root", Session: "sess-1"},
	"req_exec_older":     &Exec{Argv: []string{"python3", "-c", "print(40+2)"}, Cwd: "/workspace", Env: env("PYTHONUNBUFFERED", "1"), User: "root"},
	"req_exec_detach":    &Exec{Argv: []string{"sleep", "300"}, Detach: true},
	"req_stdin":          &Stdin{Data: B64("hello\n")},
	"req_stdin_close":    &StdinClose{},
	"req_kill":           &Kill{Pid: 1234, Signal: i32(15)},
	"req_attach":         &Attach{Pid: 1234},
	"req_fs_write":       &FsWrite{Path: "/tmp/x.txt", Mode: u32(0o644)},
	"req_fs_read":        &FsRead{Path: "/tmp/x.txt"},
	"req_fs_stat":        &FsStat{Path: "/tmp/x.txt"},
	"req_fs_list":        &FsList{Path: "/tmp"},
	"req_fs_mkdir":       &FsMkdir{Path: "/work/new", Parents: true},
	"req_fs_rm":          &FsRm{Path: "/work/old", Recursive: true},
	"req_fs_rename":      &FsRename{From: "/a", To: "/b"},
	"req_fs_push":        &FsPush{Dest: "/work/proj"},
	"req_fs_pull":        &FsPull{Path: "/work/proj"},
	"req_fs_find":        &FsFind{Path: "/work/proj", Pattern: "TODO", Glob: "*.rs"},
	"req_fs_watch":       &FsWatch{Path: "/work/proj", Recursive: true},
	"req_port_forward":   &PortForward{Port: 8080},
	"req_pty_open":       &PtyOpen{Cols: 80, Rows: 24, Cwd: "/work", Env: env("TERM", "xterm-256color"), User: "ubuntu"},
	"req_pty_resize":     &PtyResize{Pid: 1234, Cols: 120, Rows: 40},
	"req_session_create": &SessionCreate{Cwd: "/work", Env: env("LANG", "C")},
	"req_data":           &Data{Data: B64("hello")},
	"req_data_end":       &DataEnd{},
}

var wantResponses = map[string]Response{
	"resp_info":            &InfoReply{Version: "0.1.0", Proto: 2, UptimeSecs: 12, Procs: 1, Sessions: 0},
	"resp_started":         &Started{Pid: 1234},
	"resp_stdout":          &Stdout{Data: B64("42\n")},
	"resp_stderr":          &Stderr{Data: B64("oops\n")},
	"resp_exit":            &Exit{Code: 0},
	"resp_done":            &Done{},
	"resp_ready":           &Ready{},
	"resp_error":           &Error{Kind: KindNotFound, Message: "no such pid"},
	"resp_data":            &DataReply{Data: B64("hello")},
	"resp_stat":            &Stat{Info: StatInfo{Kind: FileRegular, Size: 5, Mode: 0o644, MtimeEpochSecs: 1700000000}},
	"resp_entries":         &Entries{Entries: []Entry{{Name: "x.txt", Kind: FileRegular, Size: 5}}},
	"resp_session_created": &SessionCreated{ID: "sess-1"},
	"resp_event":           &Event{Kind: "modified", Path: "/work/proj/main.rs"},
	"resp_match":           &Match{File: "/work/proj/main.rs", Line: 42, Content: "    // TODO: fix"},
	"resp_procs": &Procs{Procs: []Proc{
		{Pid: 1234, Argv: []string{"sleep", "300"}, Detached: true, State: "running", StartedAtEpochSecs: 1700000000},
		{Pid: 1235, Argv: []string{"true"}, State: "exited", ExitCode: i32(0), StartedAtEpochSecs: 1700000001},
	}},
}

func TestGoldenRequests(t *testing.T) {
	fx := fixtures(t, "req_")
	if len(fx) != len(wantRequests) {
		t.Errorf("%d request fixtures, %d expectations", len(fx), len(wantRequests))
	}
	for name, line := range fx {
		t.Run(name, func(t *testing.T) {
			want, ok := wantRequests[name]
			if !ok {
				t.Fatalf("no expectation for %s", name)
			}
			got, err := DecodeRequest(bytes.TrimSuffix(line, []byte("\n")))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded %#v, want %#v", got, want)
			}
			if !slices.Contains(Ops, got.Op()) {
				t.Fatalf("op %q not in Ops", got.Op())
			}
			enc, err := AppendRequest(nil, want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, line) {
				t.Fatalf("encoded\n %s\nwant\n %s", enc, line)
			}
			// The Reader (fast paths and reused buffers) agrees.
			r := NewReader(bytes.NewReader(line))
			rg, err := r.ReadRequest()
			if err != nil || !reflect.DeepEqual(rg, want) {
				t.Fatalf("Reader: %#v, %v", rg, err)
			}
		})
	}
}

func TestGoldenResponses(t *testing.T) {
	fx := fixtures(t, "resp_")
	if len(fx) != len(wantResponses) {
		t.Errorf("%d response fixtures, %d expectations", len(fx), len(wantResponses))
	}
	for name, line := range fx {
		t.Run(name, func(t *testing.T) {
			want, ok := wantResponses[name]
			if !ok {
				t.Fatalf("no expectation for %s", name)
			}
			got, err := DecodeResponse(bytes.TrimSuffix(line, []byte("\n")))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded %#v, want %#v", got, want)
			}
			enc, err := AppendResponse(nil, want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, line) {
				t.Fatalf("encoded\n %s\nwant\n %s", enc, line)
			}
			r := NewReader(bytes.NewReader(line))
			rg, err := r.ReadResponse()
			if err != nil || !reflect.DeepEqual(rg, want) {
				t.Fatalf("Reader: %#v, %v", rg, err)
			}
		})
	}
}

// enums.json pins every enum's full value set.
func TestGoldenEnums(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "fixtures", "v1", "enums.json"))
	if err != nil {
		t.Fatal(err)
	}
	var enums map[string][]string
	if err := json.Unmarshal(b, &enums); err != nil {
		t.Fatal(err)
	}
	strs := func(v any) []string {
		var out []string
		rv := reflect.ValueOf(v)
		for i := range rv.Len() {
			out = append(out, rv.Index(i).String())
		}
		return out
	}
	for key, have := range map[string][]string{
		"error_kind":        strs(ErrorKinds),
		"event_kind":        EventKinds,
		"file_kind":         strs(FileKinds),
		"git_branch_action": GitBranchActions,
	} {
		if !slices.Equal(enums[key], have) {
			t.Errorf("%s: fixture %v, package %v", key, enums[key], have)
		}
	}
	if len(enums) != 4 {
		t.Errorf("enums.json has %d sets, want 4", len(enums))
	}
}

// Only the four input ops continue an RPC; every terminal type ends one.
func TestClassification(t *testing.T) {
	var inputs []string
	for _, op := range Ops {
		if IsInput(op) {
			inputs = append(inputs, op)
		}
	}
	if !slices.Equal(inputs, []string{OpStdin, OpStdinClose, OpData, OpDataEnd}) {
		t.Fatalf("input ops %v", inputs)
	}
	for typ, terminal := range map[string]bool{
		TypeExit: true, TypeDone: true, TypeError: true, TypeInfo: true, TypeStat: true, TypeProcs: true,
		TypeSessionCreated: true, TypeSessions: true, TypeLspStarted: true,
		TypeStarted: false, TypeStdout: false, TypeStderr: false, TypeData: false, TypeReady: false,
		TypeEntries: false, TypeMatch: false, TypeEvent: false,
	} {
		if IsTerminal(typ) != terminal {
			t.Errorf("IsTerminal(%q) = %v", typ, !terminal)
		}
	}
}
