package chsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Version is the Cloud Hypervisor version chsim reports in vmm.ping.
const Version = "48.0.0"

// apiError is an error answer: CH sends the error chain as a JSON array of
// strings, outermost first. An empty chain means an empty body.
type apiError struct {
	status int
	chain  []string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.status, strings.Join(e.chain, ": ")) }

// vmmErr builds the chain of an error from the VMM thread: "Error from API",
// the action's message, then its causes.
func vmmErr(status int, action string, causes ...string) *apiError {
	return &apiError{status: status, chain: append([]string{"Error from API", action}, causes...)}
}

var (
	errBadRequest = &apiError{status: http.StatusBadRequest, chain: []string{"Bad Request"}}
	// CH's generic handler answers an unsupported method with 400 and no body.
	errBadMethodNoBody = &apiError{status: http.StatusBadRequest}
	errNotFound        = &apiError{status: http.StatusNotFound, chain: []string{"Not Found"}}
	// errCrashedAPI drops the connection without an answer.
	errCrashedAPI = &apiError{status: -1}
)

func deserializeErr(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, chain: []string{"Failed to deserialize JSON", msg}}
}

// routeKind mirrors how CH dispatches an endpoint, which decides the answers
// to wrong methods and unexpected bodies.
type routeKind int

const (
	putNoBody routeKind = iota // generic action, PUT without body
	putBody                    // generic action, PUT with a JSON body
	getAction                  // generic action answered on GET
	custom                     // own handler: any other method is 400 ["Bad Request"]
)

type route struct {
	kind   routeKind
	method string // for custom routes
	fn     func(s *Server, body []byte) (any, *apiError)
}

// routes is every endpoint of CH's HTTP server; the ones chsim does not
// simulate answer 500 saying so.
var routes map[string]route

func init() {
	routes = map[string]route{
		"vmm.ping":                  {kind: custom, method: http.MethodGet, fn: (*Server).ping},
		"vmm.shutdown":              {kind: custom, method: http.MethodPut, fn: (*Server).vmmShutdown},
		"vm.create":                 {kind: custom, method: http.MethodPut, fn: (*Server).create},
		"vm.info":                   {kind: custom, method: http.MethodGet, fn: (*Server).info},
		"vm.counters":               {kind: getAction, fn: (*Server).counters},
		"vm.boot":                   {kind: putNoBody, fn: (*Server).boot},
		"vm.delete":                 {kind: putNoBody, fn: (*Server).delete},
		"vm.shutdown":               {kind: putNoBody, fn: (*Server).shutdown},
		"vm.reboot":                 {kind: putNoBody, fn: (*Server).reboot},
		"vm.pause":                  {kind: putNoBody, fn: (*Server).pause},
		"vm.resume":                 {kind: putNoBody, fn: (*Server).resume},
		"vm.power-button":           {kind: putNoBody, fn: (*Server).powerButton},
		"vm.nmi":                    {kind: putNoBody, fn: notSimulated("vm.nmi")},
		"vm.snapshot":               {kind: putBody, fn: (*Server).snapshot},
		"vm.restore":                {kind: putBody, fn: (*Server).restore},
		"vm.add-net":                {kind: putBody, fn: (*Server).addNet},
		"vm.add-disk":               {kind: putBody, fn: (*Server).addDisk},
		"vm.remove-device":          {kind: putBody, fn: (*Server).removeDevice},
		"vm.resize":                 {kind: putBody, fn: (*Server).resize},
		"vm.add-device":             {kind: putBody, fn: notSimulated("vm.add-device")},
		"vm.add-user-device":        {kind: putBody, fn: notSimulated("vm.add-user-device")},
		"vm.add-fs":                 {kind: putBody, fn: notSimulated("vm.add-fs")},
		"vm.add-generic-vhost-user": {kind: putBody, fn: notSimulated("vm.add-generic-vhost-user")},
		"vm.add-pmem":               {kind: putBody, fn: notSimulated("vm.add-pmem")},
		"vm.add-vdpa":               {kind: putBody, fn: notSimulated("vm.add-vdpa")},
		"vm.add-vsock":              {kind: putBody, fn: notSimulated("vm.add-vsock")},
		"vm.resize-disk":            {kind: putBody, fn: notSimulated("vm.resize-disk")},
		"vm.resize-zone":            {kind: putBody, fn: notSimulated("vm.resize-zone")},
		"vm.receive-migration":      {kind: putBody, fn: notSimulated("vm.receive-migration")},
		"vm.send-migration":         {kind: putBody, fn: notSimulated("vm.send-migration")},
	}
}

func notSimulated(op string) func(*Server, []byte) (any, *apiError) {
	return func(*Server, []byte) (any, *apiError) {
		return nil, vmmErr(http.StatusInternalServerError, "chsim does not simulate "+op)
	}
}

// Server is one simulated VMM.
type Server struct {
	opts  Options
	log   *log.Logger
	now   func() time.Time
	crash func(string)

	mu    sync.Mutex // the VMM thread: one API call at a time, like CH
	vm    *vmInstance
	calls map[string]int
	ids   int // device id counter, shared by all device kinds as in CH

	ln       net.Listener
	lockFile *os.File
	hs       *http.Server
	quit     chan struct{}
	quitOnce sync.Once
	start    time.Time
}

// New validates the options and prepares a server; Serve starts it.
func New(opts Options) (*Server, error) {
	if opts.DirtyBytes < 0 || opts.BalloonRate < 0 || opts.GuestFSBytes < 0 {
		return nil, errors.New("chsim: negative size option")
	}
	s := &Server{
		opts:  opts,
		calls: map[string]int{},
		quit:  make(chan struct{}),
		now:   opts.Now,
		crash: opts.Crash,
	}
	w := opts.Log
	if w == nil {
		w = io.Discard
	}
	s.log = log.New(w, fmt.Sprintf("chsim[%d] ", os.Getpid()), log.LstdFlags|log.Lmicroseconds)
	if s.now == nil {
		s.now = time.Now
	}
	if s.crash == nil {
		s.crash = func(reason string) {
			s.log.Printf("crashing: %s", reason)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // SIGKILL is not deliverable late; never return
		}
	}
	s.start = s.now()
	return s, nil
}

// Listen takes the socket's lock file (<socket>.lock, as CH does), removes a
// stale socket left by a crashed VMM and binds. A live VMM on the same path
// holds the lock, so it is never unlinked from under it.
func (s *Server) Listen() error {
	lock, err := os.OpenFile(s.opts.Socket+".lock", os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("chsim: API socket lock: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return fmt.Errorf("chsim: API socket %s is in use by another VMM: %w", s.opts.Socket, err)
	}
	_ = os.Remove(s.opts.Socket)
	ln, err := net.Listen("unix", s.opts.Socket)
	if err != nil {
		lock.Close()
		return fmt.Errorf("chsim: listen: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // CH leaves its socket behind
	s.ln, s.lockFile = ln, lock
	return nil
}

// UseListener serves an inherited listener (CH's fd=<n> form) instead.
func (s *Server) UseListener(ln net.Listener) { s.ln = ln }

// Serve answers API calls until ctx ends or vmm.shutdown is called. It calls
// Listen first when no listener is set.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if s.opts.Socket == "" {
			return errors.New("chsim: no API socket path")
		}
		if err := s.Listen(); err != nil {
			return err
		}
	}
	s.log.Printf("simulated Cloud Hypervisor v%s listening on %s", Version, s.opts.Socket)
	if s.opts.ExitRandom > 0 {
		seed := s.opts.Seed
		if seed == 0 {
			seed = s.now().UnixNano()
		}
		d := time.Duration(rand.New(rand.NewPCG(uint64(seed), 0x5b)).Int64N(int64(s.opts.ExitRandom)))
		t := time.AfterFunc(d, func() { s.crash(fmt.Sprintf("random exit after %s", d)) })
		defer t.Stop()
	}
	s.hs = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- s.hs.Serve(s.ln) }()
	var err error
	select {
	case <-ctx.Done():
	case <-s.quit:
	case err = <-errc:
	}
	if ctx.Err() != nil {
		// A signal: stop at once, like CH, without waiting for calls in flight.
		_ = s.hs.Close()
	} else {
		// vmm.shutdown: let its answer reach the caller first.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.hs.Shutdown(sctx)
	}
	s.mu.Lock()
	s.teardownLocked()
	s.mu.Unlock()
	if s.lockFile != nil {
		s.lockFile.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	s.log.Printf("VMM exiting")
	return err
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Server", "Cloud Hypervisor API")
	h.Set("Content-Type", "application/json")

	op, ok := strings.CutPrefix(r.URL.Path, "/api/v1/")
	rt, known := routes[op]
	if !ok || !known {
		s.log.Printf("%s %s -> 404", r.Method, r.URL.Path)
		writeErr(w, errNotFound)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		return
	}
	// micro_http treats a zero-length body as no body.
	hasBody := len(body) > 0

	if e := checkShape(rt, r.Method, hasBody); e != nil {
		s.log.Printf("%s %s -> %d", r.Method, op, e.status)
		writeErr(w, e)
		return
	}
	if s.opts.Latency > 0 {
		time.Sleep(s.opts.Latency)
	}
	if d := s.opts.OpLatency[op]; d > 0 {
		time.Sleep(d)
	}
	s.mu.Lock()
	s.calls[op]++
	n := s.calls[op]
	var rule *FailRule
	for i := range s.opts.Fail {
		if s.opts.Fail[i].matches(op, n) {
			rule = &s.opts.Fail[i]
			break
		}
	}
	if rule != nil {
		s.mu.Unlock()
		switch rule.Action {
		case FailExit:
			s.crash(fmt.Sprintf("injected exit at %s call %d", op, n))
			panic(http.ErrAbortHandler) // only reached with an in-process Crash hook
		case FailHang:
			s.log.Printf("%s call %d: injected hang", op, n)
			select {
			case <-r.Context().Done():
			case <-s.quit:
			}
			return
		}
		e := vmmErr(rule.Status, "chsim: injected failure", fmt.Sprintf("%s call %d", op, n))
		s.log.Printf("%s call %d -> injected %d", op, n, rule.Status)
		writeErr(w, e)
		return
	}
	s.advanceLocked()
	out, e := rt.fn(s, body)
	s.mu.Unlock()

	if e == errCrashedAPI {
		panic(http.ErrAbortHandler) // an in-process Crash hook returned
	}
	if e != nil {
		s.log.Printf("%s -> %d %s", op, e.status, strings.Join(e.chain, ": "))
		writeErr(w, e)
		return
	}
	status := http.StatusNoContent
	if op == "vmm.shutdown" {
		// The real server answers 200 here, not the 204 its spec says.
		status = http.StatusOK
	}
	var data []byte
	if out != nil {
		data, _ = json.Marshal(out)
		status = http.StatusOK
	}
	s.log.Printf("%s -> %d", op, status)
	w.WriteHeader(status)
	if data != nil {
		_, _ = w.Write(data)
	}
	if op == "vmm.shutdown" {
		s.quitOnce.Do(func() { close(s.quit) })
	}
}

// checkShape answers wrong methods and bodies the way CH's router does.
func checkShape(rt route, method string, hasBody bool) *apiError {
	switch rt.kind {
	case custom:
		if method != rt.method {
			return errBadRequest
		}
	case putNoBody:
		switch method {
		case http.MethodPut:
			if hasBody {
				return errBadRequest
			}
		case http.MethodGet:
			return errBadRequest
		default:
			return errBadMethodNoBody
		}
	case putBody:
		switch method {
		case http.MethodPut:
			if !hasBody {
				return errBadRequest
			}
		case http.MethodGet:
			return errBadRequest
		default:
			return errBadMethodNoBody
		}
	case getAction:
		switch method {
		case http.MethodGet:
		case http.MethodPut:
			return errBadRequest
		default:
			return errBadMethodNoBody
		}
	}
	return nil
}

func writeErr(w http.ResponseWriter, e *apiError) {
	w.WriteHeader(e.status)
	if e.chain != nil {
		data, _ := json.Marshal(e.chain)
		_, _ = w.Write(data)
	}
}

// decodeBody decodes a request body the way serde would report problems:
// required fields missing, wrong types, unknown enum variants.
func decodeBody(body []byte, out any, required ...string) *apiError {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return deserializeErr(serdeMessage(err))
	}
	for _, f := range required {
		if _, ok := raw[f]; !ok {
			return deserializeErr(fmt.Sprintf("missing field `%s` at line 1 column %d", f, len(body)))
		}
	}
	if err := json.Unmarshal(body, out); err != nil {
		return deserializeErr(serdeMessage(err))
	}
	return nil
}

func serdeMessage(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("%s at offset %d", se.Error(), se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("invalid type: %s, expected %s for field `%s`", te.Value, te.Type, te.Field)
	}
	return err.Error()
}

// osErrText renders an error the way Rust's io::Error does, e.g.
// "No such file or directory (os error 2)".
func osErrText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		msg := errno.Error()
		if msg != "" {
			msg = strings.ToUpper(msg[:1]) + msg[1:]
		}
		return fmt.Sprintf("%s (os error %d)", msg, int(errno))
	}
	return err.Error()
}

func (s *Server) ping(_ []byte) (any, *apiError) {
	return map[string]any{
		"build_version": "v" + Version + "-chsim",
		"version":       Version,
		"pid":           os.Getpid(),
		"features":      []string{"kvm", "chsim"},
	}, nil
}

func (s *Server) vmmShutdown(_ []byte) (any, *apiError) {
	s.teardownLocked()
	return nil, nil
}

// ResolveSocketArg parses CH's --api-socket value: "path=<p>", "fd=<n>" or
// a bare path.
func ResolveSocketArg(v string) (path string, fd int, err error) {
	fd = -1
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			path = kv
		case k == "path":
			path = val
		case k == "fd":
			if _, err := fmt.Sscanf(val, "%d", &fd); err != nil || fd < 0 {
				return "", -1, fmt.Errorf("invalid fd %q", val)
			}
		default:
			return "", -1, fmt.Errorf("unknown --api-socket option %q", k)
		}
	}
	if path == "" && fd < 0 {
		return "", -1, errors.New("--api-socket needs path=<socket> or fd=<n>")
	}
	if path != "" {
		path = filepath.Clean(path)
	}
	return path, fd, nil
}
