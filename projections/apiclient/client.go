package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
)

// DefaultAddr is sandboxd's default listen address.
const DefaultAddr = "http://127.0.0.1:7777"

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// Error is a non-2xx answer: the status and the server's {"error"} message.
type Error struct {
	Status  int
	Message string
	// Method and Path name the request, for messages.
	Method, Path string
	// Redirect lists nodes with warm capacity for a claim the node
	// answered with a redirect (200 {"redirect": [...]}, the old daemon's
	// answer; Status is then 200): claim there, with no_redirect.
	Redirect []string
	// ID names a sandbox the failed request created nonetheless (a claim
	// committed but not served, or not replicated): look it up or release
	// it rather than wait for its lease to end.
	ID string
}

func (e *Error) Error() string {
	msg := e.Message
	if len(e.Redirect) > 0 {
		msg = "warm capacity on " + strings.Join(e.Redirect, ", ")
	}
	if e.ID != "" && !strings.Contains(msg, e.ID) {
		msg += " (sandbox " + e.ID + ")"
	}
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status, http.StatusText(e.Status), msg)
}

// StatusOf returns the HTTP status of an *Error in err's chain, or 0.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// Client calls one sandboxd. It is safe for concurrent use.
type Client struct {
	base  *url.URL
	token string
	hc    *http.Client
	// lookup, when set, makes the data-plane calls use the sandbox's own
	// token, read with this client's token (WithSandboxLookup).
	lookup *sandboxLookup
}

// New returns a client for addr ("http://host:port", or "host:port") sending
// token as a bearer token (none when empty). hc nil means a client without
// an overall timeout: claims of the clone and cold tiers may take minutes
// and event streams never end, so bound calls with their contexts.
func New(addr, token string, hc *http.Client) (*Client, error) {
	if addr == "" {
		addr = DefaultAddr
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("apiclient: address %q: %w", addr, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("apiclient: address %q: want http://host:port", addr)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	if hc == nil {
		hc = &http.Client{}
	}
	return &Client{base: u, token: token, hc: hc}, nil
}

// WithToken returns a client for the same node with another token (e.g. a
// claim's sandbox token).
func (c *Client) WithToken(token string) *Client {
	cp := *c
	cp.token = token
	return &cp
}

// Addr returns the base URL.
func (c *Client) Addr() string { return c.base.String() }

// request builds a request for path, given in its escaped form (a name
// escaped with url.PathEscape stays one segment).
func (c *Client) request(ctx context.Context, method, path string, query url.Values, body any) (*http.Request, error) {
	u := *c.base
	p, err := url.PathUnescape(path)
	if err != nil {
		return nil, fmt.Errorf("apiclient: path %q: %w", path, err)
	}
	u.Path, u.RawPath = u.Path+p, c.base.EscapedPath()+path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("apiclient: encode %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// do runs one request and decodes a 2xx JSON answer into out (nil: ignore).
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	req, err := c.request(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errorOf(resp, method, path)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("apiclient: %s %s: decode %d answer: %w", method, path, resp.StatusCode, err)
	}
	return nil
}

// errorOf reads an error answer. A body that is not the API's error shape
// (a proxy's page, say) still yields its status and a bounded text.
func errorOf(resp *http.Response, method, path string) *Error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &Error{Status: resp.StatusCode, Method: method, Path: path}
	var body struct {
		Error    string   `json:"error"`
		Redirect []string `json:"redirect"`
		ID       string   `json:"id"`
	}
	if json.Unmarshal(raw, &body) == nil && (body.Error != "" || len(body.Redirect) > 0) {
		e.Message, e.Redirect, e.ID = body.Error, body.Redirect, body.ID
	} else if t := strings.TrimSpace(string(raw)); t != "" {
		e.Message = t
	} else {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

func sandboxPath(id, action string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	if action != "" {
		p += "/" + action
	}
	return p
}

// Claim is POST /v1/claim. It returns once the sandbox is running (at once
// for the warm tier, after the clone or cold boot otherwise). A redirect
// answer is an *Error whose Redirect lists the nodes to claim from.
func (c *Client) Claim(ctx context.Context, req api.ClaimRequest) (*api.ClaimResponse, error) {
	var out api.ClaimResponse
	if err := c.do(ctx, http.MethodPost, "/v1/claim", nil, req, &out); err != nil {
		return nil, err
	}
	if len(out.Redirect) > 0 {
		return nil, &Error{Status: http.StatusOK, Method: http.MethodPost, Path: "/v1/claim", Redirect: out.Redirect}
	}
	return &out, nil
}

// RedirectOf returns the nodes a claim was redirected to, if err is a
// redirect answer.
func RedirectOf(err error) []string {
	var e *Error
	if errors.As(err, &e) {
		return e.Redirect
	}
	return nil
}

// ListOptions filter GET /v1/sandboxes. Zero values do not filter.
type ListOptions struct {
	ClaimRef string
	// Metadata selects sandboxes whose metadata holds every pair.
	Metadata map[string]string
	// State selects claims in that state, ended ones still retained
	// included; empty lists the live ones.
	State string
	// Tenant selects one tenant's sandboxes (root only; a tenant token
	// always lists its own).
	Tenant string
}

// Sandboxes is GET /v1/sandboxes: the sandboxes the caller may see, by id.
func (c *Client) Sandboxes(ctx context.Context, o ListOptions) ([]api.Sandbox, error) {
	q := url.Values{}
	if o.ClaimRef != "" {
		q.Set("claim_ref", o.ClaimRef)
	}
	for _, k := range slices.Sorted(maps.Keys(o.Metadata)) {
		q.Add("metadata", k+"="+o.Metadata[k])
	}
	if o.State != "" {
		q.Set("state", o.State)
	}
	if o.Tenant != "" {
		q.Set("tenant", o.Tenant)
	}
	var out struct {
		Sandboxes []api.Sandbox `json:"sandboxes"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}

// Sandbox is GET /v1/sandboxes/{id}.
func (c *Client) Sandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.do(ctx, http.MethodGet, sandboxPath(id, ""), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Release is POST /v1/sandboxes/{id}/release (idempotent).
func (c *Client) Release(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, sandboxPath(id, "release"), nil, nil, nil)
}

// Hibernate is POST /v1/sandboxes/{id}/hibernate. It returns once the
// sandbox is hibernated (its snapshot durable, its VMM stopped), or with
// the *Error that ended the wait: 500 when the snapshot failed (the
// message says why), 404 when the claim ended first, 503 past the
// server's bound (a hibernate that started continues).
func (c *Client) Hibernate(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, sandboxPath(id, "hibernate"), nil, nil, nil)
}

// Wake is POST /v1/sandboxes/{id}/wake. It returns once the sandbox runs
// again (restored and ready), or with the *Error that ended the wait, as
// Hibernate.
func (c *Client) Wake(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, sandboxPath(id, "wake"), nil, nil, nil)
}

// HibernateNoWait is Hibernate answered once the request is durable
// (?wait=false), not once it is done: it returns the sandbox's state then
// ("hibernating", or "hibernated" when it already was). It does not queue
// behind other calls on the sandbox: one in flight may make it a 409.
func (c *Client) HibernateNoWait(ctx context.Context, id string) (string, error) {
	return c.noWait(ctx, id, "hibernate")
}

// WakeNoWait is Wake answered once the request is durable, as
// HibernateNoWait: it returns "waking", or "running" when it already was.
func (c *Client) WakeNoWait(ctx context.Context, id string) (string, error) {
	return c.noWait(ctx, id, "wake")
}

func (c *Client) noWait(ctx context.Context, id, action string) (string, error) {
	var out struct {
		State string `json:"state"`
	}
	if err := c.do(ctx, http.MethodPost, sandboxPath(id, action), url.Values{"wait": {"false"}}, nil, &out); err != nil {
		return "", err
	}
	return out.State, nil
}

// Renew is POST /v1/sandboxes/{id}/renew: the new deadline is now + ttl
// (0 or negative = the default TTL, over 24 h = 24 h).
func (c *Client) Renew(ctx context.Context, id string, ttlSeconds int64) (time.Time, error) {
	var out struct {
		Deadline string `json:"deadline"`
	}
	path := sandboxPath(id, "renew")
	if err := c.do(ctx, http.MethodPost, path, nil, api.RenewRequest{TTLSeconds: ttlSeconds}, &out); err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, out.Deadline)
	if err != nil {
		return time.Time{}, fmt.Errorf("apiclient: POST %s: deadline %q: %w", path, out.Deadline, err)
	}
	return t, nil
}

// Owner is GET /v1/sandboxes/{id}/owner: the address of the owning node.
func (c *Client) Owner(ctx context.Context, id string) (string, error) {
	var out struct {
		OwnerAddr string `json:"owner_addr"`
	}
	if err := c.do(ctx, http.MethodGet, sandboxPath(id, "owner"), nil, nil, &out); err != nil {
		return "", err
	}
	return out.OwnerAddr, nil
}

// Pools is GET /v1/pools: the configured pools (draining ones left out), in
// the shape SetPools takes.
func (c *Client) Pools(ctx context.Context) (*api.PoolsRequest, error) {
	var out api.PoolsRequest
	if err := c.do(ctx, http.MethodGet, "/v1/pools", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetPools is PUT /v1/pools (root): it replaces the pool set; pools left out
// drain. It returns the node's info after the change.
func (c *Client) SetPools(ctx context.Context, req api.PoolsRequest) (*api.Info, error) {
	if req.Pools == nil {
		req.Pools = []api.PoolSpec{} // nil encodes as null, which the server refuses
	}
	var out api.Info
	if err := c.do(ctx, http.MethodPut, "/v1/pools", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Info is GET /v1/info.
func (c *Client) Info(ctx context.Context) (*api.Info, error) {
	var out api.Info
	if err := c.do(ctx, http.MethodGet, "/v1/info", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Peers is GET /v1/peers: the other nodes' addresses (none without
// replication).
func (c *Client) Peers(ctx context.Context) ([]string, error) {
	var out struct {
		Peers []string `json:"peers"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/peers", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Peers, nil
}

// Healthz is GET /healthz: nil once the node has finished its start-up
// reconcile ("ok"), an *Error with status 503 and the node's text before.
func (c *Client) Healthz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, nil, nil)
}

// Metrics is GET /metrics: the Prometheus text exposition.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	req, err := c.request(ctx, http.MethodGet, "/metrics", nil, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", errorOf(resp, http.MethodGet, "/metrics")
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
