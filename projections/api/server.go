package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/origin"
)

// Engine is what the API needs of the single writer.
type Engine interface {
	// ProposeNew proposes the command build returns for a newly minted
	// Meta (every API command is new), with engine.Engine.ProposeNew's
	// hooks. An engine that confirms more than local durability (sandboxd's
	// synchronous replication) runs Durable only once that is confirmed,
	// and not at all when it is not.
	ProposeNew(ctx context.Context, build func(fsm.Meta) fsm.Command, hooks engine.Hooks) (engine.Result, error)
	View(fn func(st *fsm.State))
}

var _ Engine = (*engine.Engine)(nil)

// Log is what the API needs of the op log: /v1/events reads it, and
// answers built from the state wait for it to be durable (WaitDurable).
type Log interface {
	Subscribe(from uint64) (*eventlog.Subscription, error)
	FirstSeq() uint64
	LastSeq() uint64
	WaitDurable(ctx context.Context, seq uint64) error
}

var _ Log = (*eventlog.Log)(nil)

// ErrShuttingDown: the server began shutting down (BeginShutdown); waiting
// requests and new relays are answered 503 with it.
var ErrShuttingDown = errors.New("sandboxd is shutting down")

// The old daemon's texts for a missing or unknown token and for a known
// token of a kind the route does not take (its clients show them).
const (
	errInvalidToken = "invalid api token"
	errOperatorOnly = "operator token required"
)

// Redirector, when set, answers a claim this node cannot serve from warm
// capacity with other nodes' addresses (the cluster view), and names the
// owner of a sandbox this node does not know. One that is also a
// PeerLister lists the other nodes for GET /v1/peers.
type Redirector interface {
	// WarmElsewhere returns addresses of nodes with warm capacity for key.
	WarmElsewhere(key fsm.PoolKey) []string
	// OwnerOf returns the owner address of a sandbox owned by another node.
	OwnerOf(id string) (addr string, ok bool)
}

// Config is the server's static configuration.
type Config struct {
	// OwnerAddr is this node's address, returned as owner_addr.
	OwnerAddr  string
	Node       string
	Hypervisor string
	// Heartbeat is the SSE heartbeat interval (default 15 s).
	Heartbeat time.Duration
	// MaxLag is how far an SSE client may fall behind the log before it is
	// disconnected with a reason (default 100000 events).
	MaxLag uint64
	// ClaimWait bounds how long a clone/cold claim's request waits for its
	// VM (default 2 min; the state fails the claim earlier).
	ClaimWait time.Duration
	// BodyTimeout bounds reading a request's body (default
	// DefaultBodyTimeout), for every request that declares one (the body
	// guard, bodyguard.go); a stalled body is answered 408 and its
	// connection closed.
	BodyTimeout time.Duration
	// LifecycleWait bounds how long a hibernate or wake waits for its
	// outcome, its turn in the sandbox's queue included (default
	// DefaultLifecycleWait); past it the answer is 503 and an operation
	// already started continues.
	LifecycleWait time.Duration
	// MetricsAuth is who may read /metrics: MetricsAuthRoot (the default,
	// as the old daemon: the root token, or anyone when no root token is
	// configured) or MetricsAuthNone (anyone).
	MetricsAuth string
	// NoDashboard turns the dashboard off: / and /dashboard/{file} are
	// then not routes (404), as on a node without one.
	NoDashboard bool
	// CheckpointTTL deletes a checkpoint that long after it is taken (the
	// old checkpoint_ttl_hours); 0 keeps it until deleted.
	CheckpointTTL time.Duration
	// MaxForkCount bounds a fork's children (default
	// fsm.DefaultMaxForkCount, the old max_fork_count).
	MaxForkCount int
	// Archive: the node has an archive store (archive_dir), so claims may
	// ask for on_expire "archive" and pools for archive settings.
	Archive bool
}

// DefaultLifecycleWait is Config.LifecycleWait's default: far beyond a
// snapshot or restore, within what an HTTP client waits for an answer.
const DefaultLifecycleWait = 2 * time.Minute

// Config.MetricsAuth's values.
const (
	MetricsAuthRoot = "root"
	MetricsAuthNone = "none"
)

// DefaultBodyTimeout is Config.BodyTimeout's default: a 1 MiB body at a
// slow client's pace, far from what holding connections open costs.
const DefaultBodyTimeout = 15 * time.Second

// Server serves the API. Create with New; feed it commits with OnCommit.
type Server struct {
	cfg     Config
	eng     Engine
	log     Log
	auth    *auth.Authenticator
	zl      zerolog.Logger
	metrics *Metrics
	redir   Redirector
	idTag   string // origin.NodeTag of cfg.Node: the first digits of the ids minted here
	mux     *http.ServeMux
	routes  []Route
	now     func() time.Time

	waitMu  sync.Mutex
	waiters map[string][]*watch // sandbox id -> the requests watching its events
	queue   verbQueue           // the waiting hibernates and wakes, per sandbox

	vms *vmView

	replication func() any // Options.Replication
	stats       StatsFunc  // Options.Stats
	egress      EgressOptions
	pools       PoolSupport      // Options.Pools
	sizes       VMSizer          // Options.Sizes
	blobs       *CheckpointBlobs // Options.Checkpoints (checkpointblob.go)

	readyMu sync.Mutex
	ready   chan struct{} // closed once the first reconcile finished

	// stopping ends when the server begins shutting down (BeginShutdown):
	// the waits of handlers derive from it (waitContext).
	stopping     context.Context
	stopHandlers context.CancelFunc

	data *dataPlane // the routes to guests (dataplane.go)
}

// Options carry the optional parts of a Server.
type Options struct {
	Log        zerolog.Logger
	Metrics    *Metrics
	Redirector Redirector
	Now        func() time.Time
	// Replication, when set, returns the node's replication status for
	// GET /v1/info's "replication" (any JSON value).
	Replication func() any
	// Stats, when set, reads a VM's VMM usage for
	// GET /v1/sandboxes/{id}/stats; without it usage is never measured.
	Stats StatsFunc
	// Egress is the node's guarded egress (env key, secret registry, CA);
	// without a key, env is refused.
	Egress EgressOptions
	// DataPlane configures the routes to sandboxes' guests.
	DataPlane DataPlane
	// Pools, when set, says which pool keys this node can serve at all
	// (PoolSupport); without it every key is taken.
	Pools PoolSupport
	// Sizes, when set, says what a VM of each pool size gets here
	// (VMSizer); without it, fsm.Sizes' row.
	Sizes VMSizer
	// Checkpoints, when set, is where GET /v1/checkpoints/{id}/blob reads
	// checkpoints (checkpointblob.go); without it the route answers 404.
	Checkpoints *CheckpointBlobs
}

// New builds a Server.
func New(cfg Config, eng Engine, log Log, a *auth.Authenticator, opts Options) *Server {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.MaxLag == 0 {
		cfg.MaxLag = 100_000
	}
	if cfg.ClaimWait <= 0 {
		cfg.ClaimWait = 2 * time.Minute
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.LifecycleWait <= 0 {
		cfg.LifecycleWait = DefaultLifecycleWait
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{
		cfg: cfg, eng: eng, log: log, auth: a, zl: opts.Log, metrics: opts.Metrics,
		redir: opts.Redirector, now: opts.Now, replication: opts.Replication, stats: opts.Stats, egress: opts.Egress, pools: opts.Pools, sizes: opts.Sizes,
		blobs:   opts.Checkpoints,
		waiters: map[string][]*watch{},
		ready:   make(chan struct{}),
	}
	if cfg.Node != "" {
		s.idTag = origin.NodeTag(cfg.Node)
	}
	s.stopping, s.stopHandlers = context.WithCancel(context.Background())
	s.vms = newVMView()
	s.data = newDataPlane(s, opts.DataPlane)
	s.mux = http.NewServeMux()
	s.register()
	return s
}

// Route is one registered route, for docs/api.md's drift test.
type Route struct {
	Method, Path string
	// Auth says who may call it: "none", "root", "root|tenant",
	// "root|tenant|sandbox", "sandbox".
	Auth string
}

// Routes returns the registered routes, sorted.
func (s *Server) Routes() []Route {
	out := append([]Route(nil), s.routes...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Method < out[j].Method
	})
	return out
}

// handlerFunc handles an authenticated request; a returned error is written
// as {"error": ...} with its status.
type handlerFunc func(w http.ResponseWriter, r *http.Request, id auth.Identity) error

type methodTable map[string]struct {
	h     handlerFunc
	allow []auth.Kind
}

func (s *Server) register() {
	paths := map[string]methodTable{}
	add := func(method, path, authDesc string, h handlerFunc, allow ...auth.Kind) {
		if paths[path] == nil {
			paths[path] = methodTable{}
		}
		paths[path][method] = struct {
			h     handlerFunc
			allow []auth.Kind
		}{h, allow}
		s.routes = append(s.routes, Route{Method: method, Path: path, Auth: authDesc})
	}
	root, tenant, sandbox := auth.Root, auth.Tenant, auth.Sandbox
	add("POST", "/v1/claim", "root|tenant", s.handleClaim, root, tenant)
	add("GET", "/v1/sandboxes", "root|tenant", s.handleList, root, tenant)
	add("GET", "/v1/sandboxes/{id}", "root|tenant|sandbox", s.handleGet, root, tenant, sandbox)
	add("POST", "/v1/sandboxes/{id}/release", "root|tenant|sandbox", s.handleRelease, root, tenant, sandbox)
	add("POST", "/v1/sandboxes/{id}/hibernate", "root|tenant|sandbox", s.handleHibernate, root, tenant, sandbox)
	add("POST", "/v1/sandboxes/{id}/wake", "root|tenant|sandbox", s.handleWake, root, tenant, sandbox)
	add("POST", "/v1/sandboxes/{id}/renew", "root|tenant|sandbox", s.handleRenew, root, tenant, sandbox)
	add("GET", "/v1/sandboxes/{id}/owner", "root|tenant|sandbox", s.handleOwner, root, tenant, sandbox)
	add("GET", "/v1/sandboxes/{id}/stats", "root|sandbox", s.handleStats, root, sandbox)
	// env takes the node's API token (root or the sandbox's tenant), as the
	// old daemon's did, not the sandbox token.
	add("GET", "/v1/sandboxes/{id}/env", "root|tenant", s.handleGetEnv, root, tenant)
	add("PUT", "/v1/sandboxes/{id}/env", "root|tenant", s.handlePutEnv, root, tenant)
	add("PATCH", "/v1/sandboxes/{id}/env", "root|tenant", s.handlePatchEnv, root, tenant)
	// The data plane: any caller it does not take is the old daemon's 404
	// (hiddenRoutes), after the header and path checks it made first.
	add("GET", "/v1/sandboxes/{id}/agent", "sandbox", s.handleAgent, sandbox)
	add("GET", "/v1/sandboxes/{id}/ports/{port}", "root|sandbox", s.handlePort, root, sandbox)
	add("POST", "/v1/sandboxes/{id}/exec", "sandbox", s.handleExec, sandbox)
	add("POST", "/v1/sandboxes/{id}/preview", "root|tenant|sandbox", s.handlePreview, root, tenant, sandbox)
	// volumes.go: the old daemon's auth (the catalog for the node's tokens;
	// a sandbox's volumes for its token or root; its instance metadata
	// for root).
	add("GET", "/v1/volumes", "root|tenant", s.handleVolumes, root, tenant)
	add("POST", "/v1/sandboxes/{id}/volumes/attach", "root|sandbox", s.handleAttachVolumes, root, sandbox)
	add("POST", "/v1/sandboxes/{id}/volumes/detach", "root|sandbox", s.handleDetachVolumes, root, sandbox)
	add("PUT", "/v1/sandboxes/{id}/instance-metadata", "root", s.handleInstanceMetadata, root, tenant)
	add("GET", "/v1/pools", "root|tenant", s.handleGetPools, root, tenant)
	add("PUT", "/v1/pools", "root", s.handlePutPools, root)
	add("GET", "/v1/info", "root", s.handleInfo, root)
	add("GET", "/v1/peers", "root|tenant", s.handlePeers, root, tenant)
	add("GET", "/v1/events", "root|tenant", s.handleEvents, root, tenant)
	add("GET", "/healthz", "none", s.handleHealthz)
	add("GET", "/openapi.json", "none", s.handleOpenAPI)
	if !s.cfg.NoDashboard {
		add("GET", "/", "none", s.handleDashboard)
		add("GET", "/dashboard/{file}", "none", s.handleDashboardFile)
	}
	if s.metricsOpen() {
		add("GET", "/metrics", "none", s.handleMetrics)
	} else {
		add("GET", "/metrics", "root", s.handleMetrics, root)
	}
	// The operator routes let tenant tokens through to refuse them with the
	// old daemon's 403 text (operatorOnly).
	add("GET", "/v1/tenants", "root", s.handleTenants, root, tenant)
	add("PUT", "/v1/tenants", "root", s.handlePutTenants, root, tenant)
	add("PUT", "/v1/tenants/{name}", "root", s.handlePutTenant, root, tenant)
	add("DELETE", "/v1/tenants/{name}", "root", s.handleDeleteTenant, root, tenant)
	add("GET", "/v1/egress/classes", "root", s.handleGetEgressClasses, root, tenant)
	add("PUT", "/v1/egress/classes/{name}", "root", s.handlePutEgressClass, root, tenant)
	add("DELETE", "/v1/egress/classes/{name}", "root", s.handleDeleteEgressClass, root, tenant)
	add("POST", "/v1/sandboxes/{id}/checkpoint", "root|tenant", s.handleCheckpoint, root, tenant)
	add("POST", "/v1/sandboxes/{id}/fork", "root|tenant", s.handleFork, root, tenant)
	add("GET", "/v1/checkpoints", "root|tenant", s.handleCheckpoints, root, tenant)
	add("DELETE", "/v1/checkpoints/{id}", "root|tenant", s.handleDeleteCheckpoint, root, tenant)
	add("POST", "/v1/checkpoints/{id}/claim", "root|tenant", s.handleCheckpointClaim, root, tenant)
	// checkpointblob.go: the transport between nodes.
	add("GET", "/v1/checkpoints/{id}/blob", "root", s.handleCheckpointBlob, root, tenant)
	add("HEAD", "/v1/checkpoints/{id}/blob", "root", s.handleCheckpointProbe, root, tenant)
	add("POST", "/v1/sandboxes/{id}/promote", "root|tenant", s.handlePromote, root, tenant)
	add("GET", "/v1/templates", "root|tenant", s.handleTemplates, root, tenant)
	add("DELETE", "/v1/templates", "root|tenant", s.handleDeleteTemplate, root, tenant)
	add("PUT", "/v1/templates/labels", "root|tenant", s.handleTemplateLabels, root, tenant)
	add("GET", "/v1/store", "root", s.handleStore, root, tenant)
	add("POST", "/v1/pools/rebuild", "root", s.handleRebuild, root, tenant)
	add("POST", "/v1/drain", "root", s.handleDrain, root, tenant)
	add("DELETE", "/v1/drain", "root", s.handleUncordon, root, tenant)

	for path, table := range paths {
		pattern := path
		if path == "/" {
			pattern = "/{$}" // the root alone: every other path stays the 404 below
		}
		s.mux.HandleFunc(pattern, s.dispatch(path, table))
	}
	// Anything else: a JSON 404, not the mux's text one.
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errorf(http.StatusNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
}

// dispatch checks the method, then authentication and authorisation, then
// runs the handler. A wrong method is 405 with an Allow header and a JSON
// body.
func (s *Server) dispatch(path string, table methodTable) http.HandlerFunc {
	methods := make([]string, 0, len(table))
	for m := range table {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	allow := strings.Join(methods, ", ")
	hidden, hides := hiddenRoutes[path]
	return func(w http.ResponseWriter, r *http.Request) {
		entry, ok := table[r.Method]
		if !ok {
			w.Header().Set("Allow", allow)
			writeError(w, errorf(http.StatusMethodNotAllowed, "method %s not allowed on %s (allowed: %s)", r.Method, path, allow))
			return
		}
		// Authentication before the body, on every route that takes a
		// token: a caller without a valid one gets its 401/403/404 at once,
		// and the body guard closes the connection rather than draining
		// it, so a stalled body holds nothing.
		var id auth.Identity
		if len(entry.allow) > 0 {
			bearer := auth.Bearer(r)
			if hides && bearer != "" && hidden.pre != nil {
				if err := hidden.pre(w, r); err != nil {
					writeError(w, err)
					return
				}
			}
			id = s.auth.Identify(bearer, r.PathValue("id"), s.tokenGen)
			permitted := false
			for _, k := range entry.allow {
				permitted = permitted || k == id.Kind
			}
			switch {
			case permitted:
			case hides:
				writeError(w, refuseSandboxCaller(bearer, hidden.unknown))
				return
			case id.Kind == auth.Anonymous:
				writeError(w, errorf(http.StatusUnauthorized, "%s", errInvalidToken))
				return
			default:
				writeError(w, errorf(http.StatusForbidden, "%s", errOperatorOnly))
				return
			}
		}
		if declaresBody(r) {
			// A body declared too large is refused before any of it is read.
			if r.ContentLength > MaxBody {
				writeError(w, errorf(http.StatusBadRequest, "%s: body over %d bytes (declared %d)", errInvalidBody, MaxBody, r.ContentLength))
				return
			}
			if !bodyMethods[r.Method] {
				writeError(w, errorf(http.StatusBadRequest, "%s %s takes no request body", r.Method, path))
				return
			}
			body, err := s.readBody(r)
			if err != nil {
				writeError(w, err)
				return
			}
			r.Body = &bufferedBody{Reader: bytes.NewReader(body), b: body}
		}
		if err := entry.h(w, r, id); err != nil {
			s.writeErr(w, r, err)
		}
	}
}

// bufferedBody is a request body dispatch has read: handlers decode its bytes
// without copying them again.
type bufferedBody struct {
	*bytes.Reader
	b []byte
}

func (*bufferedBody) Close() error { return nil }

// bodyMethods are the methods whose requests may carry a body.
var bodyMethods = map[string]bool{http.MethodPost: true, http.MethodPut: true, http.MethodPatch: true}

// readBody reads the whole request body, at most MaxBody bytes, within
// the body guard's Config.BodyTimeout: a client that declares a body and
// stalls is answered 408 and disconnected (the guard closes a connection
// whose body was not read to its end) instead of holding a connection and
// a goroutine. The guard clears its read deadline once the body is in, so
// a long handler (a claim waiting for its VM) is not cut off by it.
func (s *Server) readBody(r *http.Request) ([]byte, error) {
	var body []byte
	var err error
	if r.ContentLength > 0 {
		// Declared (and at most MaxBody, checked before): one buffer of
		// that size; net/http ends the body there.
		body = make([]byte, r.ContentLength)
		var n int
		n, err = io.ReadFull(r.Body, body)
		body = body[:n]
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return nil, errorf(http.StatusRequestTimeout, "request body not received within %s", s.cfg.BodyTimeout)
	case err != nil:
		return nil, errorf(http.StatusBadRequest, "%s: %v", errInvalidBody, err)
	case len(body) > MaxBody:
		return nil, errorf(http.StatusBadRequest, "%s: body over %d bytes", errInvalidBody, MaxBody)
	}
	return body, nil
}

// writeErr maps engine and state errors to statuses and logs server faults.
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	var ae *engine.AppendError
	var oe *ownedElsewhere
	if away, ok := ownerAwayError(err); ok {
		err = away
	}
	switch rej, isRej := fsm.AsRejection(err); {
	case errors.As(err, &he):
		writeError(w, err)
	case errors.As(err, &oe):
		// Only reads answer for another node's sandbox; a change must be
		// sent to its owner.
		writeError(w, errorf(http.StatusNotFound, "sandbox %s is not on this node: its owner is %s", r.PathValue("id"), oe.addr))
	case isRej:
		writeError(w, errorf(rej.Code.HTTPStatus(), "%s", rej.Msg))
	case errors.Is(err, ErrUnavailable):
		s.zl.Warn().Err(err).Str("path", r.URL.Path).Msg("api: unavailable")
		writeError(w, errorf(http.StatusServiceUnavailable, "%v", err))
	case errors.As(err, &ae), errors.Is(err, engine.ErrStopped):
		s.zl.Error().Err(err).Str("path", r.URL.Path).Msg("api: op log unavailable")
		writeError(w, errorf(http.StatusServiceUnavailable, "op log unavailable: %v", err))
	case errors.Is(err, context.Canceled) && s.stopping.Err() != nil:
		writeError(w, errorf(http.StatusServiceUnavailable, "%v", ErrShuttingDown))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeError(w, errorf(http.StatusServiceUnavailable, "request cancelled or timed out: %v", err))
	default:
		s.zl.Error().Err(err).Str("path", r.URL.Path).Msg("api: internal error")
		writeError(w, err)
	}
}

// ServeHTTP implements http.Handler: every request goes through the body
// guard (bodyguard.go), whatever answers it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	guardBody(s.mux, s.cfg.BodyTimeout, w, r)
}

// tokenGen looks up a sandbox's token generation for sandbox tokens. Ended
// claims keep their generation while the state retains them.
func (s *Server) tokenGen(id string) (uint64, bool) {
	var gen uint64
	var ok bool
	s.eng.View(func(st *fsm.State) {
		c, found := st.Claim(id)
		if found {
			gen, ok = tokenGenOf(&c), true
		}
	})
	return gen, ok
}

// tokenGenOf is c's sandbox token generation (the state's 0 means 1).
func tokenGenOf(c *fsm.ClaimRec) uint64 { return uint64(max(c.TokenGen, 1)) }

// durableRead runs read on the state and returns once the log is durable
// up to the state it read, with that state's sequence: an answer built
// from the read acknowledges nothing a crash could take back (the state
// runs ahead of the log by the fsync in flight).
func (s *Server) durableRead(ctx context.Context, read func(st *fsm.State)) (uint64, error) {
	var seq uint64
	s.eng.View(func(st *fsm.State) {
		read(st)
		seq = st.Applied()
	})
	return seq, s.durableAt(ctx, seq)
}

// durableAt waits until the log is durable up to seq: ctx's error when it
// ends first, ErrUnavailable when the log fails.
func (s *Server) durableAt(ctx context.Context, seq uint64) error {
	if err := s.log.WaitDurable(ctx, seq); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return nil
}

// BeginShutdown ends the waits of the handlers in flight (a hibernate or
// wake waiting for its outcome or its turn, a claim waiting for its VM, a
// drain waiting for its VMs, a relay waiting for its sandbox to run): they
// answer 503 at once instead of holding http.Server.Shutdown until its
// bound, which would leave the executors no time to stop. The node calls it
// first on Stop. Idempotent.
func (s *Server) BeginShutdown() { s.stopHandlers() }

// waitContext bounds a handler's wait: d, ctx's own end, and the server's
// shutdown (BeginShutdown), whichever comes first.
func (s *Server) waitContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, d)
	unhook := context.AfterFunc(s.stopping, cancel)
	return ctx, func() {
		unhook()
		cancel()
	}
}

// SetReady marks the first reconcile as finished: the VM view may now send
// its sync. Idempotent.
func (s *Server) SetReady() {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	select {
	case <-s.ready:
	default:
		s.vms.load(s.eng)
		close(s.ready)
	}
}

// newClaimID mints a claim id naming this node (origins.go).
func (s *Server) newClaimID() string { return newClaimID(s.idTag) }
