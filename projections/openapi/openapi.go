// Package openapi holds sandboxd's OpenAPI 3 document, the machine-readable
// contract of every route package api registers, served as GET
// /openapi.json.
//
// The document is kept as fragments in spec/*.json, embedded at build time
// and merged in file-name order: spec/base.json carries everything but the
// routes (openapi, info, security, the shared Error answer and PoolKey);
// every other fragment holds only "paths" and "components", one area of the
// API each (sandboxes, dataplane, pools, tenants, egress, node,
// checkpoints, store, templatelist, volumes). A new area's routes are one new fragment
// file, so areas added in parallel merge without touching each other. A
// path+method or a component defined by two fragments is an error, never a
// silent override.
//
// The contract: the merged document lists exactly the routes the server
// registers, with each route's auth (x-sbx-auth, as the route table says
// it), statuses (as docs/api.md's route table lists them) and the JSON
// fields of its bodies (each component named for a Go type of package api
// has exactly that type's json fields). Package api's tests check all
// three, and the validating transport of package openapitest checks live
// requests and answers against it in the conformance and e2e suites.
package openapi

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"sync"
)

//go:embed spec/*.json
var spec embed.FS

// baseFragment is the fragment that carries the document's head.
const baseFragment = "base.json"

// Document returns the merged document as JSON, or why the embedded
// fragments do not make one (a build that tests pass never has that).
// Callers must not change the bytes: every call returns the same ones.
func Document() ([]byte, error) { return document() }

var document = sync.OnceValues(func() ([]byte, error) { return merge(spec) })

// merge joins the fragments of fsys's spec/ into one document.
func merge(fsys fs.FS) ([]byte, error) {
	names, err := fs.Glob(fsys, "spec/*.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var doc map[string]any
	for _, name := range names {
		if path.Base(name) == baseFragment {
			if doc, err = readFragment(fsys, name); err != nil {
				return nil, err
			}
		}
	}
	if doc == nil {
		return nil, fmt.Errorf("openapi: no spec/%s", baseFragment)
	}
	paths := object(doc, "paths")
	components := object(doc, "components")
	for _, name := range names {
		if path.Base(name) == baseFragment {
			continue
		}
		frag, err := readFragment(fsys, name)
		if err != nil {
			return nil, err
		}
		for key := range frag {
			if key != "paths" && key != "components" {
				return nil, fmt.Errorf("openapi: %s: a fragment holds only paths and components, not %q", name, key)
			}
		}
		// Paths: two fragments may share a path (a route and its
		// neighbour), never one of its methods.
		for p, item := range object(frag, "paths") {
			ops, ok := item.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("openapi: %s: path %s is not an object", name, p)
			}
			into := object(paths, p)
			for method, op := range ops {
				if _, dup := into[method]; dup {
					return nil, fmt.Errorf("openapi: %s: %s %s is defined twice", name, method, p)
				}
				into[method] = op
			}
		}
		for section, entries := range object(frag, "components") {
			es, ok := entries.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("openapi: %s: components.%s is not an object", name, section)
			}
			into := object(components, section)
			for n, v := range es {
				if _, dup := into[n]; dup {
					return nil, fmt.Errorf("openapi: %s: components.%s.%s is defined twice", name, section, n)
				}
				into[n] = v
			}
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func readFragment(fsys fs.FS, name string) (map[string]any, error) {
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, err
	}
	var frag map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&frag); err != nil {
		return nil, fmt.Errorf("openapi: %s: %w", name, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("openapi: %s: data after the object", name)
	}
	return frag, nil
}

// object returns m[key] as an object, creating it when absent.
func object(m map[string]any, key string) map[string]any {
	if o, ok := m[key].(map[string]any); ok {
		return o
	}
	o := map[string]any{}
	m[key] = o
	return o
}
