package api

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// docPath is the API reference this test keeps in step with the code.
const docPath = "../../docs/api.md"

// docRoute is one row of docs/api.md's route table.
type docRoute struct {
	Route
	statuses []int // success and error statuses, as documented
}

// readDoc returns docs/api.md's lines.
func readDoc(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("read %s: %v", docPath, err)
	}
	return strings.Split(string(data), "\n")
}

// docTable returns the rows of the first markdown table whose header row
// starts with the given cells, cells trimmed and without backticks.
func docTable(t *testing.T, lines []string, header ...string) [][]string {
	t.Helper()
	cells := func(line string) []string {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") {
			return nil
		}
		parts := strings.Split(line[1:len(line)-1], "|")
		for i := range parts {
			parts[i] = strings.TrimSpace(strings.ReplaceAll(parts[i], "`", ""))
		}
		return parts
	}
	for i, line := range lines {
		c := cells(line)
		if len(c) < len(header) || !slices.Equal(c[:len(header)], header) {
			continue
		}
		var rows [][]string
		for _, l := range lines[i+2:] { // skip the |---| row
			r := cells(l)
			if r == nil {
				break
			}
			rows = append(rows, r)
		}
		return rows
	}
	t.Fatalf("%s has no table with header %v", docPath, header)
	return nil
}

func parseStatuses(t *testing.T, cell string) []int {
	t.Helper()
	var out []int
	for _, f := range strings.FieldsFunc(cell, func(r rune) bool { return r == ',' || r == ' ' }) {
		n, err := strconv.Atoi(f)
		if err != nil || http.StatusText(n) == "" {
			t.Fatalf("status %q in %q is not an HTTP status", f, cell)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func docRoutes(t *testing.T) []docRoute {
	t.Helper()
	var out []docRoute
	for _, r := range docTable(t, readDoc(t), "Method", "Path", "Auth", "Success", "Errors") {
		if len(r) != 5 {
			t.Fatalf("route row %v: want 5 cells", r)
		}
		authCell := strings.Join(strings.FieldsFunc(r[2], func(c rune) bool { return c == ',' || c == ' ' }), "|")
		out = append(out, docRoute{
			Route:    Route{Method: r[0], Path: r[1], Auth: authCell},
			statuses: parseStatuses(t, r[3]+","+r[4]),
		})
	}
	return out
}

func testServer(t *testing.T) *Server {
	a, err := auth.New("root", nil, []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{}, nil, nil, a, Options{Log: zerolog.Nop()})
}

// TestDocsRouteTable: docs/api.md's route table lists exactly the routes
// the server registers, with the same auth, and each has its section.
func TestDocsRouteTable(t *testing.T) {
	var doc []Route
	for _, r := range docRoutes(t) {
		doc = append(doc, r.Route)
	}
	code := testServer(t).Routes()
	key := func(r Route) string { return r.Method + " " + r.Path + " " + r.Auth }
	have := map[string]bool{}
	for _, r := range code {
		have[key(r)] = true
	}
	documented := map[string]bool{}
	for _, r := range doc {
		if documented[key(r)] {
			t.Errorf("docs list %s twice", key(r))
		}
		documented[key(r)] = true
		if !have[key(r)] {
			t.Errorf("docs list %s, which the server does not register (or with another auth)", key(r))
		}
	}
	for _, r := range code {
		if !documented[key(r)] {
			t.Errorf("route %s is not in %s's route table", key(r), docPath)
		}
	}
	lines := readDoc(t)
	for _, r := range code {
		heading := "### " + r.Method + " " + r.Path
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.TrimSpace(strings.ReplaceAll(l, "`", "")) == heading }) {
			t.Errorf("%s has no section %q", docPath, heading)
		}
	}
}

// TestDocsEventTypes: the op-log event types listed for /v1/events are the
// ones this build writes, with their aggregates.
func TestDocsEventTypes(t *testing.T) {
	var doc, code []string
	for _, r := range docTable(t, readDoc(t), "Event type", "Aggregate") {
		doc = append(doc, r[0]+" "+r[1])
	}
	for _, typ := range event.Types() {
		code = append(code, typ.String()+" "+typ.Aggregate().String())
	}
	slices.Sort(doc)
	slices.Sort(code)
	if !slices.Equal(doc, code) {
		t.Fatalf("docs list event types\n%v\nthe code has\n%v", doc, code)
	}
}

// TestDocsTypes: each JSON type's section lists exactly its fields (the
// json tags), so a field added, renamed or removed must be documented.
func TestDocsTypes(t *testing.T) {
	lines := readDoc(t)
	for _, v := range []any{ClaimRequest{}, ClaimResponse{}, Sandbox{}, RenewRequest{}, PoolSpec{}, Info{}, PoolInfo{}, SandboxStats{}, EventJSON{}, VM{}, VMChange{},
		TenantList{}, TenantJSON{}, TenantsRequest{}, TenantSpec{}, TenantRequest{}, EnvVar{}, PolicyJSON{}, EgressClassJSON{}, ExecRequest{}, ExecResponse{}, PreviewRequest{}, PreviewResponse{}, CheckpointRecord{},
		PromoteRequest{}, PromoteResponse{}, TemplateInfo{}, TemplatesResponse{}, TemplateEntry{}, LabelsRequest{}, RebuildRequest{}, StoreResponse{}, StoreSnapshot{},
		VolumeJSON{}, VolumeInfo{}, AttachVolumesRequest{}, DetachVolumesRequest{}, SandboxVolumes{}} {
		typ := reflect.TypeOf(v)
		var code []string
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if name != "" && name != "-" {
				code = append(code, name)
			}
		}
		heading := "#### `" + typ.Name() + "`"
		at := slices.IndexFunc(lines, func(l string) bool { return strings.TrimSpace(l) == heading })
		if at < 0 {
			t.Errorf("%s has no section %q", docPath, heading)
			continue
		}
		var doc []string
		for _, r := range docTable(t, lines[at:], "Field", "Type") {
			doc = append(doc, r[0])
		}
		if !slices.Equal(doc, code) {
			t.Errorf("%s: docs list fields %v, the type has %v (in this order)", typ.Name(), doc, code)
		}
	}
}

// TestDocsStatuses checks each route's documented statuses against its
// handler's code, read with go/ast: every status the handler (or a function
// of this package it calls) names must be documented, plus 401 on
// authenticated routes and 403 where dispatch refuses a kind of token that
// can reach the route (404 on hiddenRoutes, whose pre checks count as the
// handler's code); and every documented status must
// be one of those, a rejection status (400, 404, 409, 412, 429) or 503 when the
// handler proposes a command to the engine, or 500.
func TestDocsStatuses(t *testing.T) {
	an := analyse(t)
	for _, r := range docRoutes(t) {
		h, ok := an.handlers[r.Method+" "+r.Path]
		if !ok {
			continue // TestDocsRouteTable reports it
		}
		found, proposes := an.statuses(h)
		pre, hidden := an.hidden[r.Path]
		if pre != "" {
			// dispatch runs the route's pre check before the token.
			preFound, _ := an.statuses(pre)
			maps.Copy(found, preFound)
		}
		required := map[int]bool{}
		for s := range found {
			required[s] = true
		}
		if r.Auth != "none" {
			required[http.StatusUnauthorized] = true
		}
		kinds := strings.Split(r.Auth, "|")
		// A tenant token reaches every route; a sandbox token only routes
		// about its own sandbox (elsewhere it is unknown: 401). A hidden
		// route answers a caller it does not take 404 instead.
		switch {
		case hidden:
			required[http.StatusNotFound] = true
		case r.Auth != "none" && an.dispatchAuth[r.Method+" "+r.Path] && (!slices.Contains(kinds, "tenant") || strings.Contains(r.Path, "{id}") && !slices.Contains(kinds, "sandbox")):
			required[http.StatusForbidden] = true
		}
		allowed := map[int]bool{http.StatusInternalServerError: true}
		for s := range required {
			allowed[s] = true
		}
		if proposes {
			for _, s := range []int{400, 404, 409, 412, 429, 503} {
				allowed[s] = true
			}
		}
		if !slices.ContainsFunc(slices.Collect(maps.Keys(found)), func(s int) bool { return s >= 200 && s < 300 }) {
			// The success is written by another package (an SSE stream,
			// promhttp).
			allowed[http.StatusOK] = true
		}
		for s := range required {
			if !slices.Contains(r.statuses, s) {
				t.Errorf("%s %s: the code can answer %d; the docs do not list it", r.Method, r.Path, s)
			}
		}
		for _, s := range r.statuses {
			if !allowed[s] {
				t.Errorf("%s %s: the docs list %d; nothing in %s answers it", r.Method, r.Path, s, h)
			}
		}
	}
}

// analysis is the package's functions by name and the routes' handlers.
type analysis struct {
	funcs    map[string][]*ast.FuncDecl // methods and functions by name
	handlers map[string]string          // "METHOD /path" -> handler name
	// dispatchAuth: routes registered with the token kinds dispatch
	// admits (the others are open to anyone).
	dispatchAuth map[string]bool
	// hidden: the paths of hiddenRoutes (dispatch answers a caller they do
	// not take 404, never 403) -> their pre check's name ("" for none).
	hidden map[string]string
}

func analyse(t *testing.T) *analysis {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	an := &analysis{funcs: map[string][]*ast.FuncDecl{}, handlers: map[string]string{}, dispatchAuth: map[string]bool{}, hidden: map[string]string{}}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				an.funcs[fd.Name.Name] = append(an.funcs[fd.Name.Name], fd)
			}
			if gd, ok := d.(*ast.GenDecl); ok {
				an.hiddenRoutes(gd)
			}
		}
	}
	if len(an.hidden) == 0 {
		t.Fatal("found no hiddenRoutes entries")
	}
	// register() calls add("METHOD", "/path", "auth", s.handleX, ...).
	regs := an.funcs["register"]
	if len(regs) != 1 {
		t.Fatalf("want one register function, found %d", len(regs))
	}
	ast.Inspect(regs[0].Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) < 4 {
			return true
		}
		if id, ok := call.Fun.(*ast.Ident); !ok || id.Name != "add" {
			return true
		}
		method, _ := strconv.Unquote(call.Args[0].(*ast.BasicLit).Value)
		path, _ := strconv.Unquote(call.Args[1].(*ast.BasicLit).Value)
		sel, ok := call.Args[3].(*ast.SelectorExpr)
		if !ok {
			t.Fatalf("route %s %s: handler is not s.method", method, path)
		}
		an.handlers[method+" "+path] = sel.Sel.Name
		an.dispatchAuth[method+" "+path] = len(call.Args) > 4
		return true
	})
	if len(an.handlers) == 0 {
		t.Fatal("found no add(...) calls in register")
	}
	return an
}

// hiddenRoutes records the entries of the hiddenRoutes map literal, if gd
// declares it: {"/path": {unknown: ..., pre: fn}}.
func (an *analysis) hiddenRoutes(gd *ast.GenDecl) {
	for _, sp := range gd.Specs {
		vs, ok := sp.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "hiddenRoutes" || len(vs.Values) != 1 {
			continue
		}
		for _, el := range vs.Values[0].(*ast.CompositeLit).Elts {
			kv := el.(*ast.KeyValueExpr)
			path, _ := strconv.Unquote(kv.Key.(*ast.BasicLit).Value)
			pre := ""
			for _, f := range kv.Value.(*ast.CompositeLit).Elts {
				if fkv := f.(*ast.KeyValueExpr); fkv.Key.(*ast.Ident).Name == "pre" {
					pre = fkv.Value.(*ast.Ident).Name
				}
			}
			an.hidden[path] = pre
		}
	}
}

// statusByName maps net/http's StatusXxx names to their codes, derived from
// the status texts ("Too Many Requests" -> StatusTooManyRequests).
var statusByName = func() map[string]int {
	m := map[string]int{}
	for code := 100; code < 600; code++ {
		if txt := http.StatusText(code); txt != "" {
			m["Status"+strings.NewReplacer(" ", "", "-", "", "'", "").Replace(txt)] = code
		}
	}
	return m
}()

// statuses returns the statuses named in fn and every function of the
// package it calls, transitively (methods resolved by name), and whether any
// of them proposes a command to the engine.
func (an *analysis) statuses(fn string) (map[int]bool, bool) {
	out := map[int]bool{}
	proposes := false
	seen := map[string]bool{}
	var visit func(name string)
	visit = func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		for _, fd := range an.funcs[name] {
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && x.Name == "http" && strings.HasPrefix(n.Sel.Name, "Status") {
						code, ok := statusByName[n.Sel.Name]
						if !ok {
							panic(fmt.Sprintf("unknown status constant http.%s in %s", n.Sel.Name, name))
						}
						out[code] = true
					}
				case *ast.CallExpr:
					switch f := n.Fun.(type) {
					case *ast.Ident:
						visit(f.Name)
					case *ast.SelectorExpr:
						if f.Sel.Name == "Propose" || f.Sel.Name == "ProposeNew" {
							proposes = true
						}
						if x, ok := f.X.(*ast.Ident); !ok || x.Name != "http" {
							visit(f.Sel.Name)
						}
					}
				}
				return true
			})
		}
	}
	visit(fn)
	return out, proposes
}

// TestDocsStatusAnalysis guards the analysis itself on handlers whose
// statuses are known.
func TestDocsStatusAnalysis(t *testing.T) {
	an := analyse(t)
	for _, tc := range []struct {
		route    string
		want     []int
		proposes bool
	}{
		{"GET /v1/info", []int{200}, false},
		{"POST /v1/sandboxes/{id}/release", []int{204, 400, 404, 503}, true}, // 503: a sandbox of another node that cannot be reached (owners.go)
		{"GET /healthz", []int{200, 503}, false},
	} {
		got, proposes := an.statuses(an.handlers[tc.route])
		var codes []int
		for s := range got {
			codes = append(codes, s)
		}
		slices.Sort(codes)
		if !slices.Equal(codes, tc.want) || proposes != tc.proposes {
			t.Errorf("%s: statuses %v proposes %v, want %v %v", tc.route, codes, proposes, tc.want, tc.proposes)
		}
	}
}
