package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/projections/openapi"
)

// loadOpenAPI loads the served document.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	data, err := openapi.Document()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// openAPIOps is the document's operations: "METHOD /path" -> operation.
func openAPIOps(doc *openapi3.T) map[string]*openapi3.Operation {
	out := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			out[method+" "+path] = op
		}
	}
	return out
}

// TestOpenAPIRoutes: the document has exactly the routes the server
// registers (its route table), each with the route's auth in x-sbx-auth;
// and GET /openapi.json serves it.
func TestOpenAPIRoutes(t *testing.T) {
	s := testServer(t)
	ops := openAPIOps(loadOpenAPI(t))
	registered := map[string]bool{}
	for _, r := range s.Routes() {
		key := r.Method + " " + r.Path
		registered[key] = true
		op, ok := ops[key]
		if !ok {
			t.Errorf("route %s (auth %s) is not in the OpenAPI document (add it to a fragment in projections/openapi/spec)", key, r.Auth)
			continue
		}
		if got, _ := op.Extensions["x-sbx-auth"].(string); got != r.Auth {
			t.Errorf("%s: the document's x-sbx-auth is %q, the route table's auth %q", key, got, r.Auth)
		}
		if (r.Auth == "none") != (op.Security != nil && len(*op.Security) == 0) {
			t.Errorf("%s: auth %s, yet the operation's security is %v", key, r.Auth, op.Security)
		}
	}
	for key := range ops {
		if !registered[key] {
			t.Errorf("the OpenAPI document has %s, which the server does not register", key)
		}
	}

	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/openapi.json", nil))
	want, _ := openapi.Document()
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || rec.Body.String() != string(want) {
		t.Fatalf("GET /openapi.json: %d %q, %d bytes; want 200 application/json, the document", rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len())
	}
}

// TestOpenAPIStatuses: every route of docs/api.md's table is in the
// document, and each operation answers exactly the statuses of its
// row in docs/api.md's route table (which TestDocsStatuses checks against
// the handlers' code): success statuses with their bodies, error statuses
// as the shared Error answer.
func TestOpenAPIStatuses(t *testing.T) {
	ops := openAPIOps(loadOpenAPI(t))
	for _, r := range docRoutes(t) {
		key := r.Method + " " + r.Path
		op, ok := ops[key]
		if !ok {
			t.Errorf("docs/api.md lists %s, the OpenAPI document does not", key)
			continue
		}
		var got []int
		for code, resp := range op.Responses.Map() {
			n, err := strconv.Atoi(code)
			if err != nil {
				t.Errorf("%s: response %q is not a status", key, code)
				continue
			}
			got = append(got, n)
			isErr := resp.Ref == "#/components/responses/Error"
			if (n >= 400) != isErr {
				t.Errorf("%s: status %d: an error status answers #/components/responses/Error, a success its own body (ref %q)", key, n, resp.Ref)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, r.statuses) {
			t.Errorf("%s: the document lists statuses %v, docs/api.md %v", key, got, r.statuses)
		}
	}
}

// openAPITypes maps each component schema to the Go type whose JSON it
// describes; request: the schema describes what a client sends (the
// server fills in what is left out, so nothing is required but what the
// handler refuses without), else the server's answer (every field without
// omitempty is required). shapeOnly are schemas of answers built from map
// literals: the live validation (openapitest) checks those.
var (
	openAPITypes = map[string]struct {
		v       any
		request bool
	}{
		"PoolKey":            {event.PoolKey{}, false},
		"ClaimRequest":       {ClaimRequest{}, true},
		"ClaimResponse":      {ClaimResponse{}, false},
		"Redirect":           {redirectResponse{}, false},
		"Sandbox":            {Sandbox{}, false},
		"RenewRequest":       {RenewRequest{}, true},
		"SandboxStats":       {SandboxStats{}, false},
		"EnvBody":            {EnvBody{}, true},
		"EnvVar":             {EnvVar{}, true},
		"EnvInject":          {event.EnvInject{}, true},
		"PreviewRequest":     {PreviewRequest{}, true},
		"PreviewResponse":    {PreviewResponse{}, false},
		"ExecRequest":        {ExecRequest{}, true},
		"ExecResponse":       {ExecResponse{}, false},
		"PoolsRequest":       {PoolsRequest{}, true},
		"PoolSpec":           {PoolSpec{}, true},
		"Info":               {Info{}, false},
		"PoolInfo":           {PoolInfo{}, false},
		"TenantList":         {TenantList{}, false},
		"TenantJSON":         {TenantJSON{}, false},
		"TenantsRequest":     {TenantsRequest{}, true},
		"TenantSpec":         {TenantSpec{}, true},
		"TenantRequest":      {TenantRequest{}, true},
		"PolicyJSON":         {PolicyJSON{}, false},
		"EgressRule":         {event.EgressRule{}, true},
		"EgressClassJSON":    {EgressClassJSON{}, false},
		"EgressClassesJSON":  {EgressClassesJSON{}, false},
		"EgressClassRequest": {EgressClassRequest{}, true},
		"EventJSON":          {EventJSON{}, false},
		"AggregateJSON":      {AggregateJSON{}, false},
		"VM":                 {VM{}, false},
		"VMChange":           {VMChange{}, false},

		// Checkpoints and forks (checkpoints.go), promoted templates and the store (templates.go).
		"CheckpointRequest":      {CheckpointRequest{}, true},
		"CheckpointRecord":       {CheckpointRecord{}, false},
		"CheckpointResponse":     {CheckpointResponse{}, false},
		"CheckpointList":         {CheckpointList{}, false},
		"CheckpointClaimRequest": {CheckpointClaimRequest{}, true},
		"ForkRequest":            {ForkRequest{}, true},
		"ForkResponse":           {ForkResponse{}, false},
		"PromoteRequest":         {PromoteRequest{}, true},
		"PromoteResponse":        {PromoteResponse{}, false},
		"TemplateKey":            {TemplateKey{}, false},
		"TemplateInfo":           {TemplateInfo{}, false},
		"LabelsRequest":          {LabelsRequest{}, true},
		"RebuildRequest":         {RebuildRequest{}, true},
		"StoreSnapshot":          {StoreSnapshot{}, false},
		"StoreResponse":          {StoreResponse{}, false},
		"TemplateEntry":          {TemplateEntry{}, false},
		"TemplatesResponse":      {TemplatesResponse{}, false},

		// Volumes (volumes.go); VolumeJSON is both sent and answered.
		"VolumeJSON":           {VolumeJSON{}, false},
		"VolumeInfo":           {VolumeInfo{}, false},
		"AttachVolumesRequest": {AttachVolumesRequest{}, true},
		"DetachVolumesRequest": {DetachVolumesRequest{}, true},
		"SandboxVolumes":       {SandboxVolumes{}, false},
	}
	shapeOnly = []string{"Error", "SandboxList", "Deadline", "Owner", "Accepted", "EnvPatch", "Peers", "VolumeList"}
)

// TestOpenAPIFields: every component schema describes its Go type's JSON:
// the same fields (json tags), each of the JSON type the field encodes to,
// and, for answers, every field the server always writes required.
func TestOpenAPIFields(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, ref := range doc.Components.Schemas {
		gt, ok := openAPITypes[name]
		if !ok {
			if !slices.Contains(shapeOnly, name) {
				t.Errorf("component schema %s names no Go type: add it to openAPITypes (or shapeOnly for a map-literal answer)", name)
			}
			continue
		}
		s := ref.Value
		typ := reflect.TypeOf(gt.v)
		var fields, required []string
		for i := range typ.NumField() {
			f := typ.Field(i)
			jn, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if jn == "" || jn == "-" {
				continue
			}
			fields = append(fields, jn)
			if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
				required = append(required, jn)
			}
			prop, ok := s.Properties[jn]
			if !ok {
				continue
			}
			if want, got := jsonType(f.Type), schemaType(prop.Value); want != "" && got != "" && want != got {
				t.Errorf("%s.%s: the document says %s, the Go field encodes %s", name, jn, got, want)
			}
		}
		var props []string
		for p := range s.Properties {
			props = append(props, p)
		}
		sort.Strings(fields)
		sort.Strings(props)
		if !slices.Equal(fields, props) {
			t.Errorf("%s: the document has fields %v, the Go type %v", name, props, fields)
		}
		if s.AdditionalProperties.Has == nil || *s.AdditionalProperties.Has {
			t.Errorf("%s: additionalProperties must be false (the bodies are strict, the answers exact)", name)
		}
		if !gt.request {
			got := append([]string(nil), s.Required...)
			sort.Strings(got)
			sort.Strings(required)
			if !slices.Equal(got, required) {
				t.Errorf("%s: the document requires %v; the server always writes %v", name, got, required)
			}
		}
	}
	for name := range openAPITypes {
		if doc.Components.Schemas[name] == nil {
			t.Errorf("openAPITypes names %s, which the document does not have", name)
		}
	}
}

// jsonType is the JSON type t encodes to ("" when it depends: an
// interface, a type with its own MarshalJSON).
func jsonType(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Implements(reflect.TypeFor[json.Marshaler]()) || t == reflect.TypeFor[json.RawMessage]() {
		return ""
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	}
	return ""
}

// schemaType is the JSON type s allows ("" for any or a composition),
// following a lone allOf (a $ref with its own description).
func schemaType(s *openapi3.Schema) string {
	if s.Type == nil && len(s.AllOf) == 1 {
		return schemaType(s.AllOf[0].Value)
	}
	if s.Type == nil || len(s.Type.Slice()) != 1 {
		return ""
	}
	return s.Type.Slice()[0]
}

// TestOpenAPIChecksFields guards TestOpenAPIFields' reading of Go types.
func TestOpenAPIChecksFields(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{"", "string"}, {int64(0), "integer"}, {uint16(0), "integer"}, {1.5, "number"}, {true, "boolean"},
		{[]string{}, "array"}, {map[string]string{}, "object"}, {Sandbox{}, "object"},
		{json.RawMessage{}, ""}, {event.Intercept(0), ""}, {&Sandbox{}, "object"},
	} {
		if got := jsonType(reflect.TypeOf(tc.v)); got != tc.want {
			t.Errorf("jsonType(%T) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
