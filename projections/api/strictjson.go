package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
)

// checkStrictJSON reports the first object key in data that encoding/json
// would accept but a strict reading refuses: a key that matches a field of
// t only case-insensitively ({"POOLS": ...} for "pools"), and a key that
// appears twice in one object (encoding/json keeps the last, so
// {"template":"nope","Template":"default"} would claim "default"). Type
// errors and unknown fields are left to the decoder that runs after it.
func checkStrictJSON(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkStrict(dec, t, "")
}

// walkStrict consumes one JSON value from dec, checking it against t (nil:
// any value, checked for duplicate keys only).
func walkStrict(dec *json.Decoder, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[json.RawMessage]() || (t != nil && t.Kind() == reflect.Interface) {
		t = nil
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar; its type is the decoder's to check
	}
	switch d {
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walkStrict(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case '{':
		var fields map[string]reflect.Type
		var elem reflect.Type
		if t != nil {
			switch t.Kind() {
			case reflect.Struct:
				fields = jsonFields(t)
			case reflect.Map:
				elem = t.Elem()
			}
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			at := key
			if path != "" {
				at = path + "." + key
			}
			if seen[key] {
				return fmt.Errorf("duplicate field %q", at)
			}
			seen[key] = true
			vt := elem
			if fields != nil {
				ft, exact := fields[key]
				if !exact {
					for name := range fields {
						if strings.EqualFold(name, key) {
							return fmt.Errorf("unknown field %q (field names are case-sensitive: %q)", at, name)
						}
					}
				}
				vt = ft
			}
			if err := walkStrict(dec, vt, at); err != nil {
				return err
			}
		}
	}
	// The closing delimiter.
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
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
