package ch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/sbxlog/sbxlog/executors/ch"
)

// loadDoc loads and validates an OpenAPI file and builds its router.
func loadDoc(t *testing.T, path string) (*openapi3.T, routers.Router) {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("spec %s does not validate: %v", path, err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return doc, router
}

// apiDoc is one OpenAPI description the exchanges are validated against.
type apiDoc struct {
	name   string
	router routers.Router
	// describesAll: every key the client sends must be in this description
	// (the subset's promise; upstream has more than the client uses).
	describesAll bool
}

// specDocs are the descriptions TestClientAgainstSpec validates against: the
// project's subset always, the upstream file too where it is available.
func specDocs(t *testing.T) []apiDoc {
	t.Helper()
	_, router := loadDoc(t, subsetFile)
	docs := []apiDoc{{name: "subset", router: router, describesAll: true}}
	if path, ok := upstreamFile(t); ok {
		_, router := loadDoc(t, path)
		docs = append(docs, apiDoc{name: "upstream", router: router})
	} else {
		t.Logf("upstream CH OpenAPI file not found (set %s): validating against the subset only", upstreamEnv)
	}
	return docs
}

// exchange is one request and its response as they crossed the wire.
type exchange struct {
	method, path string
	reqHeader    http.Header
	reqBody      []byte
	status       int
	respHeader   http.Header
	respBody     []byte
}

// recorder is a unix-socket proxy in front of a VMM that keeps every
// exchange, so the test sees the client's real bytes and the server's.
type recorder struct {
	mu  sync.Mutex
	log []exchange
}

func (r *recorder) take() []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

func startRecorder(t *testing.T, dir, target string) (string, *recorder) {
	t.Helper()
	sock := filepath.Join(dir, "proxy.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", target)
		},
		DisableKeepAlives: true,
	}}
	rec := &recorder{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		out, err := http.NewRequestWithContext(req.Context(), req.Method, "http://localhost"+req.URL.Path, bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out.Header = req.Header.Clone()
		resp, err := up.Do(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		respBody, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rec.mu.Lock()
		rec.log = append(rec.log, exchange{req.Method, req.URL.Path, req.Header.Clone(), body, resp.StatusCode, resp.Header.Clone(), respBody})
		rec.mu.Unlock()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(respBody)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock, rec
}

// specQuirk says whether a response the OpenAPI description does not allow is
// one of the known places where the real CH server differs from it, and
// which. The server wins there, and chsim and the client follow it:
// vmm.shutdown answers 200 with no body instead of 204; 405 is never sent (a
// wrong method or an unexpected body is 400); wrong-state calls (pause,
// resume or shutdown without a running VM, a snapshot of a running VM, a
// restore into a VMM that holds a VM) answer 500; 404 means no VM yet or an
// unknown device id, 409 a duplicate id or path; and every error body is CH's
// error chain, a JSON array of strings.
func specQuirk(op string, status int, body []byte) (string, bool) {
	isChain := func() bool {
		var chain []string
		return json.Unmarshal(body, &chain) == nil && len(chain) > 0
	}
	switch {
	case op == "vmm.shutdown" && status == http.StatusOK && len(body) == 0:
		return "vmm.shutdown answers 200, not 204", true
	case status == http.StatusBadRequest && (len(body) == 0 || isChain()):
		return "wrong method or unexpected body is 400, never 405", true
	case status == http.StatusInternalServerError && isChain():
		return "wrong-state calls answer 500 with the error chain", true
	case status == http.StatusNotFound && isChain():
		return "404 for no VM or an unknown device id", true
	case status == http.StatusConflict && isChain():
		return "409 for a duplicate id or path", true
	}
	return "", false
}

// validate checks one exchange against one description and returns what
// failed. Against the subset (describesAll) it also checks that the request
// body holds no key the description leaves out, so the subset lists every
// field the client sends.
func validate(ctx context.Context, d apiDoc, ex exchange) []string {
	var bad []string
	op := strings.TrimPrefix(ex.path, "/api/v1/")
	req, err := http.NewRequestWithContext(ctx, ex.method, "http://localhost"+ex.path, bytes.NewReader(ex.reqBody))
	if err != nil {
		return []string{err.Error()}
	}
	req.Header = ex.reqHeader.Clone()
	route, params, err := d.router.FindRoute(req)
	if err != nil {
		return []string{"no route in the spec: " + err.Error()}
	}
	in := &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{RejectWhenRequestBodyNotSpecified: true},
	}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
		bad = append(bad, "request: "+err.Error())
	}
	if d.describesAll && len(ex.reqBody) > 0 {
		bad = append(bad, undescribedRequestKeys(route.Operation, ex.reqBody)...)
	}
	rin := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 ex.status,
		Header:                 ex.respHeader,
		Body:                   io.NopCloser(bytes.NewReader(ex.respBody)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true},
	}
	if err := openapi3filter.ValidateResponse(ctx, rin); err != nil {
		if _, ok := specQuirk(op, ex.status, ex.respBody); !ok {
			bad = append(bad, "response: "+err.Error())
		}
	}
	// Every error body, documented status or not, is CH's chain.
	if ex.status >= 400 && len(ex.respBody) > 0 {
		var chain []string
		if json.Unmarshal(ex.respBody, &chain) != nil {
			bad = append(bad, "error body is not a JSON array of strings: "+string(ex.respBody))
		}
	}
	for i := range bad {
		bad[i] = d.name + ": " + bad[i]
	}
	return bad
}

// TestClientAgainstSpec drives every client method against chsim through a
// recording proxy and validates each request and response with the OpenAPI
// description: the project's subset (testdata/ch-api-subset.yaml) always,
// the upstream OpenAPI file as well where it is available. A client method
// that no step exercises fails the test.
func TestClientAgainstSpec(t *testing.T) {
	docs := specDocs(t)
	ctx := context.Background()
	dir := shortDir(t)
	sim := startSim(t, dir, "SBX_CHSIM_BALLOON_RATE=0")
	proxy, rec := startRecorder(t, dir, sim.Socket)
	c := ch.New(proxy)

	kernel, disk := guestFiles(t, dir)
	volume := filepath.Join(dir, "volume.img")
	if err := os.WriteFile(volume, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := ch.NewConfig(ch.Payload{Kernel: kernel, Cmdline: "console=ttyS0"}, 1, 64<<20)
	cfg.AddDisk(disk)
	cfg.SetVsock(3, filepath.Join(dir, "vsock.sock"))
	cfg.SetSerialFile(filepath.Join(dir, "serial.log"))
	cfg.SetBalloonSize(16 << 20)
	if err := cfg.Set(map[string]any{"kept": true}, "x_unknown_section"); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(dir, "snap")
	if err := os.Mkdir(snapDir, 0o755); err != nil {
		t.Fatal(err)
	}
	snapURL, err := ch.FileURL(snapDir)
	if err != nil {
		t.Fatal(err)
	}

	type step struct {
		method  string // the Client method the step exercises
		call    func() error
		wantErr func(error) bool // nil: must succeed
	}
	var info *ch.VmInfo
	steps := []step{
		{"Ping", func() error { p, err := c.Ping(ctx); _ = p; return err }, nil},
		{"Info", func() error { _, err := c.Info(ctx); return err }, ch.IsNotFound},
		{"Create", func() error { return c.Create(ctx, cfg) }, nil},
		{"Info", func() error { var err error; info, err = c.Info(ctx); return err }, nil},
		{"Boot", func() error { return c.Boot(ctx) }, nil},
		{"Counters", func() error { _, err := c.Counters(ctx); return err }, nil},
		{"AddNet", func() error {
			pci, err := c.AddNet(ctx, ch.NetConfig{Tap: "sbxtap9", Mac: "52:54:00:12:34:56", ID: "net9"})
			if err == nil && (pci == nil || pci.ID != "net9") {
				return errors.New("hot add answered no PCI info")
			}
			return err
		}, nil},
		{"AddNet", func() error { _, err := c.AddNet(ctx, ch.NetConfig{Tap: "sbxtap9", ID: "net9"}); return err }, ch.IsConflict},
		{"RemoveDevice", func() error { return c.RemoveDevice(ctx, "net9") }, nil},
		{"RemoveDevice", func() error { return c.RemoveDevice(ctx, "net9") }, ch.IsNotFound},
		// A volume: hot-plugged read-only with its serial, a second add of
		// the same id or path refused, then removed.
		{"AddDisk", func() error {
			pci, err := c.AddDisk(ctx, ch.DiskConfig{Path: volume, Readonly: true, Serial: "dataset", ID: "vol-dataset"})
			if err == nil && (pci == nil || pci.ID != "vol-dataset") {
				return errors.New("hot add answered no PCI info")
			}
			return err
		}, nil},
		{"AddDisk", func() error {
			_, err := c.AddDisk(ctx, ch.DiskConfig{Path: volume, Readonly: true, ID: "vol-other"})
			return err
		}, ch.IsConflict},
		{"RemoveDevice", func() error { return c.RemoveDevice(ctx, "vol-dataset") }, nil},
		{"Resize", func() error { return c.Resize(ctx, ch.ResizeBalloon(8<<20)) }, nil},
		{"Snapshot", func() error { return c.Snapshot(ctx, snapURL) }, ch.IsInvalidState},
		{"Pause", func() error { return c.Pause(ctx) }, nil},
		{"Pause", func() error { return c.Pause(ctx) }, nil}, // 500 InvalidStateTransition(Paused, Paused) is success
		{"Snapshot", func() error { return c.Snapshot(ctx, snapURL) }, nil},
		{"Shutdown", func() error { return c.Shutdown(ctx) }, nil},
		{"Shutdown", func() error { return c.Shutdown(ctx) }, ch.IsInvalidState},
		{"Delete", func() error { return c.Delete(ctx) }, nil},
		{"Restore", func() error {
			return c.Restore(ctx, ch.RestoreConfig{SourceURL: snapURL, MemoryRestoreMode: ch.RestoreCopyOnWrite})
		}, nil},
		{"Restore", func() error { return c.Restore(ctx, ch.RestoreConfig{SourceURL: snapURL}) }, ch.IsConflict},
		{"Resume", func() error { return c.Resume(ctx) }, nil},
		{"Resume", func() error { return c.Resume(ctx) }, nil}, // running already: success
		{"ShutdownVMM", func() error { return c.ShutdownVMM(ctx) }, nil},
	}

	validated := map[string]int{}
	quirks := map[string]bool{}
	for i, s := range steps {
		err := s.call()
		switch {
		case s.wantErr == nil && err != nil:
			t.Fatalf("step %d %s: %v", i, s.method, err)
		case s.wantErr != nil && (err == nil || !s.wantErr(err)):
			t.Fatalf("step %d %s: err = %v, want a classified error", i, s.method, err)
		}
		exs := rec.take()
		if len(exs) == 0 {
			t.Fatalf("step %d %s sent nothing", i, s.method)
		}
		for _, ex := range exs {
			var bad []string
			for _, d := range docs {
				bad = append(bad, validate(ctx, d, ex)...)
			}
			if len(bad) > 0 {
				t.Errorf("step %d %s: %s %s -> %d %s:\n  %s", i, s.method, ex.method, ex.path, ex.status, ex.respBody, strings.Join(bad, "\n  "))
				continue
			}
			if q, ok := specQuirk(strings.TrimPrefix(ex.path, "/api/v1/"), ex.status, ex.respBody); ok && ex.status != http.StatusNotFound && ex.status != http.StatusConflict {
				quirks[q] = true
			}
			validated[s.method]++
		}
	}
	if info == nil || info.State != ch.StateCreated || info.Config.VsockSocket() == "" {
		t.Errorf("vm.info after create = %+v", info)
	} else if v, ok := info.Config.Get("x_unknown_section", "kept"); !ok || v != true {
		t.Error("the server's config lost a key the client sent")
	}
	if err := sim.WaitExit(5e9); err != nil {
		t.Error("chsim still running after vmm.shutdown")
	}

	// Every exported method of the client must have been validated.
	notAPI := map[string]bool{"SocketPath": true}
	typ := reflect.TypeOf(&ch.Client{})
	var missing []string
	for i := 0; i < typ.NumMethod(); i++ {
		m := typ.Method(i).Name
		if !notAPI[m] && validated[m] == 0 {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("client methods without a spec-validated call: %v", missing)
	}
	for _, q := range []string{"vmm.shutdown answers 200, not 204", "wrong-state calls answer 500 with the error chain"} {
		if !quirks[q] {
			t.Errorf("quirk %q was not exercised", q)
		}
	}
}
