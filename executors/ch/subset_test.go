package ch_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// The project keeps its own description of the CH API it uses, so that a
// checkout tests its client with nothing beside it. The upstream OpenAPI file
// is not part of the repository; where it is available the subset is also
// checked against it.
const (
	// subsetFile is the part of the CH API the project uses.
	subsetFile = "testdata/ch-api-subset.yaml"
	// upstreamEnv names the upstream CH OpenAPI file. Unset, the file is
	// looked for at shared/spec/cloud-hypervisor.yaml in the checkout's parent
	// directory, where CI puts it.
	upstreamEnv = "SBX_CH_OPENAPI"
	// requireEnv=1 (set by CI) fails instead of skipping the upstream checks
	// when the upstream file is missing.
	requireEnv = "SBX_REQUIRE_CH_SPEC"
)

// upstreamFile finds the upstream CH OpenAPI file. A path named by
// $SBX_CH_OPENAPI must exist; the default location may be missing, which
// fails the test only under $SBX_REQUIRE_CH_SPEC=1.
func upstreamFile(t *testing.T) (string, bool) {
	t.Helper()
	if p := os.Getenv(upstreamEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", upstreamEnv, err)
		}
		return p, true
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	p := filepath.Join(dir, "..", "shared", "spec", "cloud-hypervisor.yaml")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv(requireEnv) == "1" {
			t.Fatalf("upstream CH OpenAPI file required (%s=1) but not found (set %s): %v", requireEnv, upstreamEnv, err)
		}
		return "", false
	}
	return p, true
}

// TestSubsetAgreesWithUpstream checks that every path, method, status and
// schema field of the subset exists in the upstream file with the same shape.
func TestSubsetAgreesWithUpstream(t *testing.T) {
	path, ok := upstreamFile(t)
	if !ok {
		t.Skipf("upstream CH OpenAPI file not found (set %s, or %s=1 to fail here)", upstreamEnv, requireEnv)
	}
	sub, _ := loadDoc(t, subsetFile)
	up, _ := loadDoc(t, path)
	for _, d := range docDiffs(sub, up) {
		t.Error(d)
	}
}

// TestDocDiffsFindsDisagreements pins the comparison itself, without the
// upstream file: the subset agrees with itself, and each kind of change to
// the other side is reported.
func TestDocDiffsFindsDisagreements(t *testing.T) {
	sub, _ := loadDoc(t, subsetFile)
	if d := docDiffs(sub, sub); len(d) > 0 {
		t.Fatalf("subset disagrees with itself: %v", d)
	}
	schema := func(doc *openapi3.T, name string) *openapi3.Schema { return doc.Components.Schemas[name].Value }
	cases := []struct {
		name   string
		mutate func(up *openapi3.T)
		want   string // a substring of one reported difference
	}{
		{"path gone", func(up *openapi3.T) { up.Paths.Delete("/vm.pause") }, "/vm.pause: no such path"},
		{"method gone", func(up *openapi3.T) { up.Paths.Value("/vm.boot").Put = nil }, "PUT /vm.boot: no such operation"},
		{"status gone", func(up *openapi3.T) { up.Paths.Value("/vm.info").Get.Responses.Delete("404") }, "GET /vm.info 404: no such response"},
		{"body gone", func(up *openapi3.T) { up.Paths.Value("/vm.resize").Put.RequestBody = nil }, "PUT /vm.resize: no request body"},
		{"body optional", func(up *openapi3.T) { up.Paths.Value("/vm.resize").Put.RequestBody.Value.Required = false }, "request body required"},
		{"field gone", func(up *openapi3.T) { delete(schema(up, "RestoreConfig").Properties, "resume") }, "RestoreConfig).resume: no such property"},
		{"type", func(up *openapi3.T) {
			schema(up, "BalloonConfig").Properties["size"].Value.Type = &openapi3.Types{"string"}
		}, "type [integer] vs [string]"},
		{"format", func(up *openapi3.T) { schema(up, "VmInfo").Properties["memory_actual_size"].Value.Format = "int32" }, "format int64 vs int32"},
		{"enum", func(up *openapi3.T) { schema(up, "MemoryRestoreMode").Enum = []any{"Copy", "OnDemand"} }, "enum"},
		{"default", func(up *openapi3.T) { schema(up, "MemoryRestoreMode").Default = "OnDemand" }, "default Copy vs OnDemand"},
		{"required", func(up *openapi3.T) { schema(up, "VsockConfig").Required = []string{"socket"} }, "required [cid socket] vs [socket]"},
		{"minimum", func(up *openapi3.T) { schema(up, "CpusConfig").Properties["boot_vcpus"].Value.Min = nil }, "minimum"},
		{"items", func(up *openapi3.T) { schema(up, "VmmPingResponse").Properties["features"].Value.Items = nil }, "features: no items"},
		{"map values", func(up *openapi3.T) { schema(up, "VmCounters").AdditionalProperties.Schema = nil }, "no additionalProperties schema"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up, _ := loadDoc(t, subsetFile) // a fresh copy to mutate
			c.mutate(up)
			diffs := docDiffs(sub, up)
			if !slices.ContainsFunc(diffs, func(d string) bool { return strings.Contains(d, c.want) }) {
				t.Fatalf("differences %q lack %q", diffs, c.want)
			}
		})
	}
}

// docDiffs lists where sub is not a faithful subset of up.
func docDiffs(sub, up *openapi3.T) []string {
	var out []string
	for _, p := range sub.Paths.InMatchingOrder() {
		upItem := up.Paths.Value(p)
		if upItem == nil {
			out = append(out, p+": no such path upstream")
			continue
		}
		ops := sub.Paths.Value(p).Operations()
		methods := make([]string, 0, len(ops))
		for m := range ops {
			methods = append(methods, m)
		}
		slices.Sort(methods)
		for _, m := range methods {
			at := m + " " + p
			uop := upItem.GetOperation(m)
			if uop == nil {
				out = append(out, at+": no such operation upstream")
				continue
			}
			out = append(out, opDiffs(at, ops[m], uop)...)
		}
	}
	return out
}

func opDiffs(at string, s, u *openapi3.Operation) []string {
	var out []string
	switch {
	case s.RequestBody == nil && u.RequestBody != nil:
		out = append(out, at+": upstream takes a request body the subset omits")
	case s.RequestBody != nil && u.RequestBody == nil:
		out = append(out, at+": no request body upstream")
	case s.RequestBody != nil:
		sb, ub := s.RequestBody.Value, u.RequestBody.Value
		if sb.Required != ub.Required {
			out = append(out, fmt.Sprintf("%s: request body required %v vs %v", at, sb.Required, ub.Required))
		}
		out = append(out, contentDiffs(at+" request", sb.Content, ub.Content)...)
	}
	codes := s.Responses.Keys()
	slices.Sort(codes)
	for _, code := range codes {
		ur := u.Responses.Value(code)
		if ur == nil {
			out = append(out, fmt.Sprintf("%s %s: no such response upstream", at, code))
			continue
		}
		sc, uc := s.Responses.Value(code).Value.Content, ur.Value.Content
		if len(sc) == 0 && len(uc) > 0 {
			out = append(out, fmt.Sprintf("%s %s: upstream describes a body the subset omits", at, code))
		}
		out = append(out, contentDiffs(at+" "+code, sc, uc)...)
	}
	return out
}

func contentDiffs(at string, s, u openapi3.Content) []string {
	var out []string
	types := make([]string, 0, len(s))
	for mt := range s {
		types = append(types, mt)
	}
	slices.Sort(types)
	for _, mt := range types {
		um := u.Get(mt)
		if um == nil {
			out = append(out, fmt.Sprintf("%s: no %s content upstream", at, mt))
			continue
		}
		out = append(out, schemaDiffs(at+" "+refName(s[mt].Schema), s[mt].Schema, um.Schema, map[[2]*openapi3.Schema]bool{})...)
	}
	return out
}

func refName(r *openapi3.SchemaRef) string {
	if r == nil || r.Ref == "" {
		return "(inline)"
	}
	return "(" + r.Ref[strings.LastIndex(r.Ref, "/")+1:] + ")"
}

// schemaDiffs compares the shape of the subset's schema s with upstream's u:
// type, format, enum, bounds, required list and a default the subset states,
// then every property, the items and the map values the subset describes.
// Properties upstream has and the subset leaves out are fine.
func schemaDiffs(at string, s, u *openapi3.SchemaRef, seen map[[2]*openapi3.Schema]bool) []string {
	if s == nil || s.Value == nil {
		return nil
	}
	if u == nil || u.Value == nil {
		return []string{at + ": no schema upstream"}
	}
	sv, uv := s.Value, u.Value
	if seen[[2]*openapi3.Schema{sv, uv}] {
		return nil
	}
	seen[[2]*openapi3.Schema{sv, uv}] = true
	var out []string
	diff := func(what string, a, b any) {
		out = append(out, fmt.Sprintf("%s: %s %v vs %v", at, what, a, b))
	}
	if st, ut := sv.Type.Slice(), uv.Type.Slice(); !slices.Equal(st, ut) {
		diff("type", st, ut)
	}
	if sv.Format != uv.Format {
		diff("format", sv.Format, uv.Format)
	}
	if !reflect.DeepEqual(sv.Enum, uv.Enum) {
		diff("enum", sv.Enum, uv.Enum)
	}
	if sv.Default != nil && !reflect.DeepEqual(sv.Default, uv.Default) {
		diff("default", sv.Default, uv.Default)
	}
	if !reflect.DeepEqual(sv.Min, uv.Min) || !reflect.DeepEqual(sv.Max, uv.Max) {
		diff("minimum/maximum", fmt.Sprint(deref(sv.Min), "/", deref(sv.Max)), fmt.Sprint(deref(uv.Min), "/", deref(uv.Max)))
	}
	if sv.Nullable != uv.Nullable {
		diff("nullable", sv.Nullable, uv.Nullable)
	}
	sr, ur := slices.Sorted(slices.Values(sv.Required)), slices.Sorted(slices.Values(uv.Required))
	if !slices.Equal(sr, ur) {
		diff("required", sr, ur)
	}
	names := make([]string, 0, len(sv.Properties))
	for n := range sv.Properties {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		up, ok := uv.Properties[n]
		if !ok {
			out = append(out, fmt.Sprintf("%s.%s: no such property upstream", at, n))
			continue
		}
		out = append(out, schemaDiffs(at+"."+n, sv.Properties[n], up, seen)...)
	}
	if sv.Items != nil {
		if uv.Items == nil {
			out = append(out, at+": no items upstream")
		} else {
			out = append(out, schemaDiffs(at+"[]", sv.Items, uv.Items, seen)...)
		}
	}
	if sa := sv.AdditionalProperties; sa.Schema != nil {
		if uv.AdditionalProperties.Schema == nil {
			out = append(out, at+": no additionalProperties schema upstream")
		} else {
			out = append(out, schemaDiffs(at+"{}", sa.Schema, uv.AdditionalProperties.Schema, seen)...)
		}
	}
	if sh, uh := sv.AdditionalProperties.Has, uv.AdditionalProperties.Has; !reflect.DeepEqual(sh, uh) {
		diff("additionalProperties", fmt.Sprint(deref(sh)), fmt.Sprint(deref(uh)))
	}
	return out
}

func deref[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}

// configSchema is the schema whose unknown keys are legitimate: VmConfig is
// kept as a JSON tree so that any CH version's config.json round-trips.
const configSchema = "#/components/schemas/VmConfig"

// undescribedRequestKeys lists the keys of a request body the subset does not
// describe (below VmConfig everything goes).
func undescribedRequestKeys(op *openapi3.Operation, body []byte) []string {
	if op.RequestBody == nil || op.RequestBody.Value.Content.Get("application/json") == nil {
		return []string{"request has a body the subset does not describe"}
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return []string{"request body is not JSON: " + err.Error()}
	}
	return undescribed("body", op.RequestBody.Value.Content.Get("application/json").Schema, v)
}

func undescribed(at string, s *openapi3.SchemaRef, v any) []string {
	if s == nil || s.Value == nil || s.Ref == configSchema {
		return nil
	}
	var out []string
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			switch {
			case s.Value.Properties[k] != nil:
				out = append(out, undescribed(at+"."+k, s.Value.Properties[k], e)...)
			case s.Value.AdditionalProperties.Schema != nil:
				out = append(out, undescribed(at+"."+k, s.Value.AdditionalProperties.Schema, e)...)
			default:
				out = append(out, fmt.Sprintf("request: %s.%s is not in the subset", at, k))
			}
		}
	case []any:
		for i, e := range t {
			out = append(out, undescribed(fmt.Sprintf("%s[%d]", at, i), s.Value.Items, e)...)
		}
	}
	slices.Sort(out)
	return out
}

// TestClientTypesInSubset checks every JSON field of the client's typed
// bodies against the subset: it must be a property of the schema with the
// same JSON type, and a field the client sends must not be omitted when the
// schema requires it.
func TestClientTypesInSubset(t *testing.T) {
	sub, _ := loadDoc(t, subsetFile)
	cases := []struct {
		v      any
		schema string
		sent   bool // a request body (else decoded from a response)
	}{
		{ch.PingResponse{}, "VmmPingResponse", false},
		{ch.VmInfo{}, "VmInfo", false},
		{ch.DeviceNode{}, "DeviceNode", false},
		{ch.PciDeviceInfo{}, "PciDeviceInfo", false},
		{ch.Counters{}, "VmCounters", false},
		{ch.RestoreConfig{}, "RestoreConfig", true},
		{ch.NetConfig{}, "NetConfig", true},
		{ch.Resize{}, "VmResize", true},
	}
	for _, c := range cases {
		typ := reflect.TypeOf(c.v)
		t.Run(typ.Name(), func(t *testing.T) {
			ref := sub.Components.Schemas[c.schema]
			if ref == nil {
				t.Fatalf("no schema %s in the subset", c.schema)
			}
			s := ref.Value
			if got, want := jsonType(typ), s.Type.Slice(); !slices.Equal([]string{got}, want) {
				t.Fatalf("%s is a JSON %s, schema %s is %v", typ, got, c.schema, want)
			}
			if typ.Kind() != reflect.Struct {
				return
			}
			for i := 0; i < typ.NumField(); i++ {
				f := typ.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				if !f.IsExported() || name == "-" {
					continue
				}
				if name == "" {
					name = f.Name
				}
				p := s.Properties[name]
				if p == nil {
					t.Errorf("%s.%s: %q is not a property of %s in the subset", typ.Name(), f.Name, name, c.schema)
					continue
				}
				if got, want := jsonType(f.Type), p.Value.Type.Slice(); !slices.Equal([]string{got}, want) {
					t.Errorf("%s.%s is a JSON %s, %s.%s is %v", typ.Name(), f.Name, got, c.schema, name, want)
				}
				if c.sent && slices.Contains(s.Required, name) && strings.Contains(opts, "omitempty") {
					t.Errorf("%s.%s: %s requires %q but the client may omit it", typ.Name(), f.Name, c.schema, name)
				}
			}
		})
	}
}

// jsonType is the OpenAPI type encoding/json gives a Go type.
func jsonType(t reflect.Type) string {
	if t == reflect.TypeOf(ch.VmConfig{}) || t == reflect.TypeOf(&ch.VmConfig{}) {
		return "object" // its own MarshalJSON: always an object
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonType(t.Elem())
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	}
	return t.Kind().String()
}

// TestConfigPathsInSubset checks every VmConfig path package ch's accessors
// and the executors read or write against the subset's VmConfig ("*" is any
// array element).
func TestConfigPathsInSubset(t *testing.T) {
	sub, _ := loadDoc(t, subsetFile)
	cases := []struct {
		path string
		typ  string
	}{
		{"payload.kernel", "string"},
		{"payload.cmdline", "string"},
		{"payload.initramfs", "string"},
		{"payload.firmware", "string"},
		{"cpus.boot_vcpus", "integer"},
		{"cpus.max_vcpus", "integer"},
		{"memory.size", "integer"},
		{"memory.shared", "boolean"},
		{"memory.hugepages", "boolean"},
		{"balloon.size", "integer"},
		{"disks.*.path", "string"},
		{"disks.*.id", "string"},
		{"net.*.tap", "string"},
		{"net.*.id", "string"},
		{"net.*.mac", "string"},
		{"rng.src", "string"},
		{"vsock.cid", "integer"},
		{"vsock.socket", "string"},
		{"vsock.id", "string"},
		{"serial.mode", "string"},
		{"serial.file", "string"},
		{"console.mode", "string"},
		{"console.file", "string"},
	}
	for _, c := range cases {
		s := sub.Components.Schemas["VmConfig"].Value
		for _, part := range strings.Split(c.path, ".") {
			if s == nil {
				break
			}
			if part == "*" {
				if s.Items == nil {
					s = nil
					break
				}
				s = s.Items.Value
				continue
			}
			p := s.Properties[part]
			if p == nil {
				s = nil
				break
			}
			s = p.Value
		}
		if s == nil {
			t.Errorf("VmConfig %s: not in the subset", c.path)
		} else if got := s.Type.Slice(); !slices.Equal(got, []string{c.typ}) {
			t.Errorf("VmConfig %s: type %v, want %s", c.path, got, c.typ)
		}
	}
}
