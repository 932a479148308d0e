package fsm

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// forbiddenImport reports why path may not be imported by the state machine.
func forbiddenImport(path string) string {
	switch {
	case path == "os" || strings.HasPrefix(path, "os/"):
		return "I/O"
	case path == "net" || strings.HasPrefix(path, "net/"):
		return "network"
	case path == "math/rand" || strings.HasPrefix(path, "math/rand/") || path == "crypto/rand":
		return "randomness"
	case path == "syscall" || strings.HasPrefix(path, "golang.org/x/sys"):
		return "system calls"
	case path == "unsafe" || path == "runtime" || path == "sync" || path == "sync/atomic":
		return "runtime and concurrency"
	case strings.Contains(path, "pebble"):
		return "storage"
	case strings.Contains(path, "nats"):
		return "messaging"
	}
	return ""
}

// forbiddenTime are the time functions that read the clock or schedule.
var forbiddenTime = []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "Tick", "NewTicker", "NewTimer"}

// purityViolations checks one parsed file: forbidden imports, clock reads,
// rand selectors, goroutines, and (with type info) ranges over maps that are
// not marked "//fsm:unordered <why>" on the same line, the marker saying the
// iteration order cannot reach any output.
func purityViolations(fset *token.FileSet, f *ast.File, info *types.Info) []string {
	var out []string
	pos := func(n ast.Node) string { return fset.Position(n.Pos()).String() }
	marked := map[int]bool{}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if strings.HasPrefix(c.Text, "//fsm:unordered ") {
				marked[fset.Position(c.Pos()).Line] = true
			}
		}
	}
	names := map[string]string{} // local name -> import path
	for _, imp := range f.Imports {
		path := strings.Trim(imp.Path.Value, `"`)
		if why := forbiddenImport(path); why != "" {
			out = append(out, fmt.Sprintf("%s: imports %s (%s)", pos(imp), path, why))
		}
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = path
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			id, ok := n.X.(*ast.Ident)
			if !ok {
				break
			}
			if names[id.Name] == "time" && slices.Contains(forbiddenTime, n.Sel.Name) {
				out = append(out, fmt.Sprintf("%s: calls time.%s", pos(n), n.Sel.Name))
			}
			if id.Name == "rand" {
				out = append(out, fmt.Sprintf("%s: uses rand.%s", pos(n), n.Sel.Name))
			}
		case *ast.GoStmt:
			out = append(out, fmt.Sprintf("%s: starts a goroutine", pos(n)))
		case *ast.RangeStmt:
			if info == nil {
				break
			}
			if _, isMap := info.TypeOf(n.X).Underlying().(*types.Map); isMap && !marked[fset.Position(n.Pos()).Line] {
				out = append(out, fmt.Sprintf("%s: ranges over a map without an //fsm:unordered marker", pos(n)))
			}
		}
		return true
	})
	return out
}

// exportLookup resolves imports from the build cache's export data, so the
// package type-checks exactly as the compiler sees it.
func exportLookup(t *testing.T, pkg string) func(string) (io.ReadCloser, error) {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	files := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && v != "" {
			files[k] = v
		}
	}
	return func(path string) (io.ReadCloser, error) {
		f, ok := files[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	}
}

// Acceptance 1: no non-test file under fsm/ imports os, net, math/rand,
// pebble or nats, reads the clock, or lets map order reach an output.
// fsm/engine, the single writer below the state machine, is outside the
// rule: it owns the clock, the op ids' randomness, goroutines and locks.
func TestPurity(t *testing.T) {
	dirs := map[string][]*ast.File{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path == "engine" {
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs["."]) < 5 {
		t.Fatalf("found only %d files in fsm/: wrong working directory?", len(dirs["."]))
	}
	for dir, files := range dirs {
		pkg := "./" + dir
		conf := types.Config{Importer: importer.ForCompiler(fset, "gc", exportLookup(t, pkg))}
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
		if _, err := conf.Check(pkg, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", pkg, err)
		}
		for _, f := range files {
			for _, v := range purityViolations(fset, f, info) {
				t.Error(v)
			}
		}
	}
}

// The checker itself must catch each kind of violation.
func TestPurityCheckerCatches(t *testing.T) {
	src := `package x
import (
	"os"
	"net/http"
	mr "math/rand"
	"time"
	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go"
)
func f(m map[string]int) int {
	_ = time.Now()
	_ = time.Since(time.Time{})
	_ = rand.Intn(3)
	go f(nil)
	n := 0
	for k := range m {
		n += len(k)
	}
	for k := range m { //fsm:unordered counting only
		n += len(k)
	}
	return n
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	// Type info for the two range statements only (the imports do not
	// resolve here).
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	mapType := types.NewMap(types.Typ[types.String], types.Typ[types.Int])
	ast.Inspect(f, func(n ast.Node) bool {
		if r, ok := n.(*ast.RangeStmt); ok {
			info.Types[r.X] = types.TypeAndValue{Type: mapType}
		}
		return true
	})
	got := strings.Join(purityViolations(fset, f, info), "\n")
	for _, want := range []string{"imports os", "imports net/http", "imports math/rand", "imports github.com/cockroachdb/pebble/v2",
		"imports github.com/nats-io/nats.go", "calls time.Now", "calls time.Since", "uses rand.Intn", "starts a goroutine", "x.go:16:2: ranges over a map"} {
		if !strings.Contains(got, want) {
			t.Errorf("checker missed %q; got:\n%s", want, got)
		}
	}
	if strings.Contains(got, "x.go:19") {
		t.Errorf("checker flagged the marked range:\n%s", got)
	}
}
