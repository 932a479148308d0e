package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// layers is the design card's top level, lowest first: a package may import
// the project's packages of its own layer and of lower ones only. The pure
// core at the bottom knows nothing of the drivers, projections or binaries
// built on it.
var layers = []string{"eventlog", "fsm", "executors", "projections", "cmd", "bench"}

const module = "github.com/sbxlog/sbxlog/"

func layerOf(pkg string) int {
	top, _, _ := strings.Cut(strings.TrimPrefix(pkg, module), "/")
	for i, l := range layers {
		if l == top {
			return i
		}
	}
	return -1
}

// TestLayers checks every non-test package of the module: it sits under one
// of the top-level directories and imports nothing from a layer above its
// own (test files may: they exercise a package from above).
func TestLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	n := 0
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		n++
		own := layerOf(p.ImportPath)
		if own < 0 {
			t.Errorf("%s is outside the top-level layers %v", p.ImportPath, layers)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			if l := layerOf(imp); l > own {
				t.Errorf("%s (layer %s) imports %s (layer %s, above it)", p.ImportPath, layers[own], imp, layers[l])
			}
		}
	}
	if n < 40 {
		t.Fatalf("go list found only %d packages: wrong module?", n)
	}
}
