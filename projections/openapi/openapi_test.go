package openapi

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestDocumentValidates: the merged document is a valid OpenAPI 3 document
// (kin-openapi's loader resolves every $ref, its validator checks the rest).
func TestDocumentValidates(t *testing.T) {
	data, err := Document()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if doc.Paths.Len() == 0 || len(doc.Components.Schemas) == 0 {
		t.Fatalf("merged document has %d paths and %d schemas", doc.Paths.Len(), len(doc.Components.Schemas))
	}
}

// TestMerge: fragments join; a method or component defined twice, a
// fragment with more than paths and components, or no base is an error.
func TestMerge(t *testing.T) {
	base := `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{},"components":{"schemas":{"E":{"type":"object"}}}}`
	for _, tc := range []struct {
		name  string
		files map[string]string
		err   string // "" for success
	}{
		{"two areas on one path", map[string]string{
			"spec/base.json": base,
			"spec/a.json":    `{"paths":{"/x":{"get":{"responses":{"200":{"description":"ok"}}}}}}`,
			"spec/b.json":    `{"paths":{"/x":{"put":{"responses":{"204":{"description":"ok"}}}}},"components":{"schemas":{"B":{"type":"object"}}}}`,
		}, ""},
		{"a method twice", map[string]string{
			"spec/base.json": base,
			"spec/a.json":    `{"paths":{"/x":{"get":{}}}}`,
			"spec/b.json":    `{"paths":{"/x":{"get":{}}}}`,
		}, "get /x is defined twice"},
		{"a schema twice", map[string]string{
			"spec/base.json": base,
			"spec/a.json":    `{"components":{"schemas":{"E":{"type":"object"}}}}`,
		}, "components.schemas.E is defined twice"},
		{"a head in a fragment", map[string]string{
			"spec/base.json": base,
			"spec/a.json":    `{"info":{}}`,
		}, `not "info"`},
		{"no base", map[string]string{"spec/a.json": `{}`}, "no spec/base.json"},
		{"trailing data", map[string]string{"spec/base.json": base + "{}"}, "data after the object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for n, s := range tc.files {
				fsys[n] = &fstest.MapFile{Data: []byte(s)}
			}
			out, err := merge(fsys)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("merge: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("merge: %v, want an error with %q", err, tc.err)
			case tc.err == "":
				for _, want := range []string{`"get"`, `"put"`, `"B"`, `"E"`} {
					if !strings.Contains(string(out), want) {
						t.Errorf("merged document lacks %s:\n%s", want, out)
					}
				}
			}
		})
	}
}
