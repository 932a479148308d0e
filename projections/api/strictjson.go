package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"
)

// checkStrictJSON reports the first object key in data that encoding/json
// would accept but a strict reading refuses: a key that matches a field of
// t only case-insensitively ({"POOLS": ...} for "pools"), and a key that
// appears twice in one object (encoding/json keeps the last, so
// {"template":"nope","Template":"default"} would claim "default"). Syntax
// errors, type errors and unknown fields are left to the decoder that runs
// after it: on input it cannot follow, the scan stops and reports nothing.
//
// It scans the bytes itself, without allocating for a well-formed body
// whose keys have no escapes and are valid UTF-8: it runs on every claim.
func checkStrictJSON(data []byte, t reflect.Type) error {
	s := scanner{b: data}
	if err := s.value(t, ""); err != nil && err != errStop {
		return err
	}
	return nil
}

// scanner walks one JSON text. Its methods return errStop (not a
// strictness error) when the text is not well-formed.
type scanner struct {
	b     []byte
	i     int
	depth int
}

// maxDepth bounds nesting as encoding/json does: deeper input is left to
// the decoder (which refuses it) instead of growing the stack.
const maxDepth = 10000

// errStop ends the scan quietly: the decoder reports what is wrong.
var errStop = fmt.Errorf("api: not well-formed JSON")

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// elem is the type a JSON value decodes into, with pointers stripped; nil
// for any value (interface, json.RawMessage), checked for duplicates only.
func elem(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[json.RawMessage]() || (t != nil && t.Kind() == reflect.Interface) {
		return nil
	}
	return t
}

func (s *scanner) value(t reflect.Type, path string) error {
	t = elem(t)
	if s.depth++; s.depth > maxDepth {
		return errStop
	}
	defer func() { s.depth-- }()
	s.ws()
	if s.i >= len(s.b) {
		return nil
	}
	switch s.b[s.i] {
	case '{':
		return s.object(t, path)
	case '[':
		var et reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			et = t.Elem()
		}
		s.i++
		for n := 0; ; n++ {
			s.ws()
			if s.i < len(s.b) && s.b[s.i] == ']' {
				s.i++
				return nil
			}
			ep := ""
			if nested(et) {
				ep = fmt.Sprintf("%s[%d]", path, n)
			}
			if err := s.value(et, ep); err != nil {
				return err
			}
			s.ws()
			if s.i >= len(s.b) {
				return errStop
			}
			switch s.b[s.i] {
			case ',':
				s.i++
			case ']':
				s.i++
				return nil
			default:
				return errStop
			}
		}
	case '"':
		_, _, err := s.str()
		return err
	default:
		// A number, true, false or null.
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', ']', '}', ' ', '\t', '\n', '\r':
				return nil
			}
			s.i++
		}
		return nil
	}
}

// str scans a string at s.i and returns its raw contents (between the
// quotes) and whether it holds escapes.
func (s *scanner) str() (raw []byte, escaped bool, err error) {
	start := s.i + 1
	for j := start; j < len(s.b); j++ {
		switch s.b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			s.i = j + 1
			return s.b[start:j], escaped, nil
		}
	}
	return nil, false, errStop
}

func (s *scanner) object(t reflect.Type, path string) error {
	var fields map[string]reflect.Type
	var mapElem reflect.Type
	if t != nil {
		switch t.Kind() {
		case reflect.Struct:
			fields = jsonFields(t)
		case reflect.Map:
			mapElem = t.Elem()
		}
	}
	// The keys seen in this object: a few, compared as bytes; past a few,
	// a set, so a body of many keys costs linear time, not quadratic.
	var seenArr [16][]byte
	seen := seenArr[:0]
	var seenSet map[string]struct{}
	s.i++
	for {
		s.ws()
		if s.i >= len(s.b) {
			return errStop
		}
		if s.b[s.i] == '}' {
			s.i++
			return nil
		}
		if s.b[s.i] != '"' {
			return errStop
		}
		raw, escaped, err := s.str()
		if err != nil {
			return err
		}
		key := raw
		// Escapes, and invalid UTF-8 (which the decoder reads as U+FFFD),
		// make the key the decoder sees differ from its bytes: compare
		// that one.
		if escaped || !utf8.Valid(raw) {
			var k string
			if json.Unmarshal(s.b[s.i-len(raw)-2:s.i], &k) != nil {
				return errStop
			}
			key = []byte(k)
		}
		dup := false
		if seenSet != nil {
			_, dup = seenSet[string(key)]
			seenSet[string(key)] = struct{}{}
		} else {
			for _, k := range seen {
				dup = dup || bytes.Equal(k, key)
			}
			if seen = append(seen, key); len(seen) == len(seenArr) {
				seenSet = make(map[string]struct{}, 2*len(seenArr))
				for _, k := range seen {
					seenSet[string(k)] = struct{}{}
				}
			}
		}
		if dup {
			return fmt.Errorf("duplicate field %q", joinPath(path, key))
		}
		vt := mapElem
		if fields != nil {
			ft, exact := fields[string(key)]
			if !exact {
				for name := range fields {
					if strings.EqualFold(name, string(key)) {
						return fmt.Errorf("unknown field %q (field names are case-sensitive: %q)", joinPath(path, key), name)
					}
				}
			}
			vt = ft
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return errStop
		}
		s.i++
		var sub string
		if nested(vt) {
			// A path only where a nested error could name it.
			sub = joinPath(path, key)
		}
		if err := s.value(vt, sub); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return errStop
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errStop
		}
	}
}

// nested reports whether a value of type t holds objects whose keys an
// error could name (the path is built only then).
func nested(t reflect.Type) bool {
	t = elem(t)
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Slice, reflect.Array:
		return true
	}
	return false
}

func joinPath(path string, key []byte) string {
	if path == "" {
		return string(key)
	}
	return path + "." + string(key)
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// jsonFields maps the JSON names of t's fields (promoted ones of embedded
// structs included) to their types, as encoding/json names them.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					if _, dup := m[k]; !dup {
						m[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}
