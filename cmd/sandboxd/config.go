package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsauth"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/executors/archive"
	"github.com/sbxlog/sbxlog/executors/netguard"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Config is sandboxd's configuration file (-config), JSON. Flags override it.
type Config struct {
	// Listen is the HTTP API's address.
	Listen string `json:"listen"`
	// OwnerAddr is the address other nodes and clients use to reach this node
	// (owner_addr in replies; redirect targets). Default: Listen.
	OwnerAddr string `json:"owner_addr,omitempty"`
	// PreviewListen is the preview listener's address (the old daemon's
	// preview_listen): preview URLs (POST /v1/sandboxes/{id}/preview) are
	// served there. Empty: no preview (501). PreviewAdvertise is the
	// address (or base URL) minted into them; default the listener's.
	// Tokens are signed with the node secret: the old preview_secret is
	// not needed.
	PreviewListen    string `json:"preview_listen,omitempty"`
	PreviewAdvertise string `json:"preview_advertise,omitempty"`
	// DataDir holds the op log, snapshots, the node secret, run dirs and the
	// snapshot store.
	DataDir string `json:"data_dir"`
	// ArchiveDir is the archive store (archive.go): a directory, meant to
	// be on another filesystem than DataDir, where hibernated sandboxes
	// are archived (on_expire "archive", pools' archive_after_seconds).
	// Empty: no archive; such claims and pools are refused.
	ArchiveDir string `json:"archive_dir,omitempty"`
	// archive is ArchiveDir opened at start (openArchive).
	archive archive.Store
	// NodeID names this node's log; any printable id of at most 128 bytes
	// (its JetStream subject carries the id's subject token, see
	// stream.Token). Default: the host name with every character other
	// than letters, digits, '-' and '_' replaced by '-' (defaultNodeID).
	NodeID string `json:"node_id,omitempty"`
	// nodeIDFrom is the host name NodeID was derived from ("" when it was
	// configured), for the start-up log.
	nodeIDFrom string
	// APIToken is the root token. Empty: APITokenFile's.
	APIToken string `json:"api_token,omitempty"`
	// APITokenFile, used when APIToken is empty, holds the root token (its
	// first line); sandboxd creates it with a random token if it does not
	// exist. With neither set (config file or not) sandboxd uses
	// <data_dir>/api.token, which is how `make run` gets a root token.
	APITokenFile string `json:"api_token_file,omitempty"`
	// Tenants seed the tenant set: {name, token_sha256 (hex SHA-256 of the
	// token) or token (plaintext, as the old daemon's config had it: hashed
	// at load and kept nowhere), max_claims, egress_class}. They apply at
	// every start until the API (/v1/tenants) first changes the set; from
	// then on the API's set wins and differing config tenants are ignored
	// with a warning.
	Tenants []auth.TenantConfig `json:"tenants,omitempty"`
	// MaxClaims caps live claims on this node (0 = no cap).
	MaxClaims int `json:"max_claims,omitempty"`
	// Volumes is the node's volume catalog, as the old daemon's config had
	// it: {name, path (the host's disk image, a filesystem sandboxes mount),
	// writable, tenants}. The config owns it: every start applies it
	// (docs/operations.md, "Volumes").
	Volumes []fsm.VolumeSpec `json:"volumes,omitempty"`
	// RelayMemoryBytes is the node's relay memory budget: every data-plane
	// relay (agent, ports, exec) reserves its worst-case buffers from it
	// before it opens, and a relay that does not fit is refused with 503
	// (0: api.DefaultRelayMemory, 512 MiB; else at least
	// api.MinRelayMemory).
	RelayMemoryBytes int64 `json:"relay_memory_bytes,omitempty"`
	// Pools applied on the first start (an empty log); afterwards PUT /v1/pools
	// owns pool configuration and the log remembers it.
	Pools []PoolConfig `json:"pools,omitempty"`
	// RefillConcurrency bounds concurrent executor operations.
	// Default NumCPU*2/3 clamped to [4, 256].
	RefillConcurrency int `json:"refill_concurrency,omitempty"`
	// RestoreMode is CH's memory_restore_mode for clones and wakes: CopyOnWrite
	// (default), OnDemand or Copy.
	RestoreMode string `json:"restore_mode,omitempty"`
	// Hypervisor: auto (cloud-hypervisor from PATH, else chsim), cloud-hypervisor,
	// chsim or qemu.
	Hypervisor string `json:"hypervisor,omitempty"`
	// CHBinary overrides the VMM binary path.
	CHBinary string `json:"ch_binary,omitempty"`
	// QEMU configures hypervisor qemu (see qemu.go).
	QEMU QEMUConfig `json:"qemu"`
	// Bridge is the bridge taps of egress pools attach to. Every egress tap
	// is locked with nftables to its VM's proxy door on the bridge's IPv4
	// address (guarded egress, proxy.go).
	Bridge string `json:"bridge,omitempty"`
	// EgressProxy configures the egress proxy and the door ports (proxy.go).
	EgressProxy *ProxyConfig `json:"egress_proxy,omitempty"`
	// NATS configures replication.
	NATS NATSConfig `json:"nats"`
	// HTTP bounds the API's connections.
	HTTP HTTPConfig `json:"http"`
	// MetricsAuth is who may read /metrics: "root" (default, as the old
	// daemon: the root token; anyone when there is no root token) or
	// "none" (anyone, for a scraper without the token).
	MetricsAuth string `json:"metrics_auth,omitempty"`
	// Dashboard serves the web dashboard at / (default true); false turns
	// it off (/ and /dashboard/{file} are then 404).
	Dashboard *bool `json:"dashboard,omitempty"`
	// CheckpointTTLHours deletes a checkpoint that long after it is taken
	// (the old daemon's checkpoint_ttl_hours; 0 keeps it until deleted).
	CheckpointTTLHours int `json:"checkpoint_ttl_hours,omitempty"`
	// MaxForkCount bounds a fork's children (the old max_fork_count;
	// default 16).
	MaxForkCount int `json:"max_fork_count,omitempty"`
	// LogLevel: debug, info, warn, error.
	LogLevel string `json:"log_level,omitempty"`
	// VMRestart is the policy for claimed VMs whose VMM dies: cold restarts
	// from the VM's own disk, at most max within window_seconds, then the
	// claim fails. Default 3 per 600 s; max 0 turns restarts off.
	VMRestart *RestartConfig `json:"vm_restart,omitempty"`
	// Secrets is guarded egress's secret registry, the old daemon's:
	// {name, header, value_env}. A rule's secret names one; its value is
	// the claim's host-only env entry named value_env (or name), else the
	// node's, read from the process environment variable value_env at
	// start (never from this file: a "value" is refused).
	Secrets []SecretConfig `json:"secrets,omitempty"`
	// EgressClasses seed the egress classes ({name, egress}) tenants name
	// with egress_class, until the API (/v1/egress/classes) first changes
	// them, as with tenants.
	EgressClasses []EgressClassConfig `json:"egress_classes,omitempty"`
	// EgressInternalAllow are internal destinations the egress proxy may
	// reach all the same: "CIDR" or "CIDR:port,port".
	EgressInternalAllow []string `json:"egress_internal_allow,omitempty"`
	// EgressUsageSeconds is how often each sandbox's egress bytes are
	// recorded (default 60; a sandbox's last record is written at its
	// release).
	EgressUsageSeconds int `json:"egress_usage_seconds,omitempty"`
}

// SecretConfig is one secret of the registry. Value exists only to refuse
// it with the old daemon's text.
type SecretConfig struct {
	egress.SecretSpec
	Value *string `json:"value,omitempty"`
}

// EgressClassConfig is one egress class, the old config's shape.
type EgressClassConfig struct {
	Name   string         `json:"name"`
	Egress *egress.Policy `json:"egress"`
}

// egressConfig is the node's egress configuration.
func (c *Config) egressConfig() node.EgressConfig {
	ec := node.EgressConfig{InternalAllow: c.EgressInternalAllow, UsageEvery: time.Duration(c.EgressUsageSeconds) * time.Second}
	for _, s := range c.Secrets {
		ec.Secrets = append(ec.Secrets, s.SecretSpec)
	}
	for _, cl := range c.EgressClasses {
		ec.Classes = append(ec.Classes, fsm.EgressClassSpec{Name: cl.Name, Policy: *cl.Egress})
	}
	for _, p := range c.Pools {
		if p.Egress != nil {
			if ec.PoolEgress == nil {
				ec.PoolEgress = map[fsm.PoolKey]*egress.Policy{}
			}
			pol := p.Egress.Policy()
			ec.PoolEgress[p.Spec().PoolKey] = &pol
		}
	}
	return ec
}

// validateEgress checks the egress settings the node cannot check later
// with the old daemon's texts: secrets, classes, pools' policies (their
// rules and secrets), internal allow entries.
func (c *Config) validateEgress() error {
	var errs []error
	specs := make([]egress.SecretSpec, 0, len(c.Secrets))
	for i, s := range c.Secrets {
		if s.Value != nil {
			errs = append(errs, fmt.Errorf("secrets[%d]: value is not supported, use value_env", i))
		}
		specs = append(specs, s.SecretSpec)
	}
	if err := egress.ValidateSecrets(specs); err != nil {
		errs = append(errs, err)
	}
	known := func(name string) bool {
		return slices.ContainsFunc(specs, func(s egress.SecretSpec) bool { return s.Name == name })
	}
	check := func(p egress.Policy, what string, scope egress.Scope) {
		n := egress.Normalize(p)
		if err := egress.Validate(n, scope); err != nil {
			errs = append(errs, fmt.Errorf("%s egress: %w", what, err))
		}
		for i, r := range n.Allow {
			if r.Secret != "" && !known(r.Secret) {
				errs = append(errs, fmt.Errorf("%s egress: allow[%d]: unknown secret %q", what, i, r.Secret))
			}
		}
	}
	seen := map[string]bool{}
	for _, cl := range c.EgressClasses {
		switch {
		case seen[cl.Name]:
			errs = append(errs, fmt.Errorf("duplicate egress class %q", cl.Name))
		case cl.Egress == nil:
			errs = append(errs, fmt.Errorf("egress class %q needs egress", cl.Name))
		default:
			check(*cl.Egress, fmt.Sprintf("egress class %q", cl.Name), egress.ScopeClass)
		}
		seen[cl.Name] = true
	}
	for _, p := range c.Pools {
		if p.Egress != nil {
			pol := p.Egress.Policy()
			check(pol, fmt.Sprintf("pool %q", p.Template), egress.ScopePool)
			if egress.Intercepts(pol) && (c.EgressProxy == nil || !c.EgressProxy.Intercept) {
				errs = append(errs, fmt.Errorf("pool %q: intercept needs egress_ca (root_cert + this node's intermediate_cert/intermediate_key)", p.Template))
			}
		}
	}
	if _, err := netguard.ParseAllow(c.EgressInternalAllow); err != nil {
		errs = append(errs, err)
	}
	if c.EgressUsageSeconds < 0 || c.EgressUsageSeconds > 3600 {
		errs = append(errs, fmt.Errorf("egress_usage_seconds %d out of [0, 3600]", c.EgressUsageSeconds))
	}
	return errors.Join(errs...)
}

// HTTPConfig is the http section: how long a client may take to send a
// request's headers and its body, and how long a keep-alive connection may
// stay idle, in milliseconds (0: the defaults, 10 s, 15 s and 30 s).
type HTTPConfig struct {
	ReadHeaderTimeoutMS int `json:"read_header_timeout_ms,omitempty"`
	BodyTimeoutMS       int `json:"body_timeout_ms,omitempty"`
	IdleTimeoutMS       int `json:"idle_timeout_ms,omitempty"`
}

func (h HTTPConfig) validate() error {
	for _, f := range []struct {
		name string
		ms   int
	}{{"read_header_timeout_ms", h.ReadHeaderTimeoutMS}, {"body_timeout_ms", h.BodyTimeoutMS}, {"idle_timeout_ms", h.IdleTimeoutMS}} {
		if f.ms < 0 || f.ms > 3_600_000 {
			return fmt.Errorf("http.%s %d out of [0, 3600000]", f.name, f.ms)
		}
	}
	return nil
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// RestartConfig is the vm_restart section.
type RestartConfig struct {
	Max           int   `json:"max"`
	WindowSeconds int64 `json:"window_seconds"`
}

// restartPolicy is the policy stamped into VMExited commands.
func (c *Config) restartPolicy() fsm.RestartPolicy {
	if c.VMRestart == nil {
		return fsm.DefaultRestartPolicy
	}
	return fsm.RestartPolicy{Max: c.VMRestart.Max, WindowNS: c.VMRestart.WindowSeconds * int64(time.Second)}
}

// finishPools gives each pool without net or size the defaults claims and
// PUT /v1/pools use (net none, size small; the start-up log names every
// pool's whole key) and checks the set as the log will: a pool set the log
// would refuse is refused here, before anything is written, so a first
// start that fails on it leaves nothing that changes the next one.
func (c *Config) finishPools() error {
	for i := range c.Pools {
		p := &c.Pools[i]
		if p.Net == "" {
			p.Net = defaultPoolNet
		}
		if p.Size == "" {
			p.Size = defaultPoolSize
		}
	}
	if err := fsm.ValidatePools(c.poolSpecs()); err != nil {
		return fmt.Errorf("pools: %w", err)
	}
	return nil
}

// poolSpecs are the config's pools as the log records them (their egress
// policies go separately, with the node's egress config).
func (c *Config) poolSpecs() []fsm.PoolSpec {
	specs := make([]fsm.PoolSpec, len(c.Pools))
	for i := range c.Pools {
		specs[i] = c.Pools[i].Spec()
	}
	return specs
}

// The pool fields' defaults, as a claim's and PUT /v1/pools'.
const (
	defaultPoolNet  = "none"
	defaultPoolSize = "small"
)

// PoolConfig is one pool as written in config: the same object as in PUT
// /v1/pools (api.PoolSpec), so both accept the same JSON and go to the log
// the same way (Spec). Egress is the pool's egress policy (applied with the
// pool on a first start; PUT /v1/pools changes it afterwards).
type PoolConfig = api.PoolSpec

// NATSConfig selects embedded NATS (default) or an existing cluster.
type NATSConfig struct {
	// Credentials and TLS for url: user and password, token,
	// nkey_seed_file, creds_file (one of them), tls_ca, tls_cert, tls_key.
	// The embedded server takes none: it generates <data_dir>/nats.nk.
	natsauth.Config
	// URL of an existing NATS cluster (comma-separated server URLs); empty
	// embeds a single-node server with its store in <data_dir>/nats.
	URL string `json:"url,omitempty"`
	// Port of the embedded server on loopback. 0 (default): the listen
	// port + 1000 (7777 -> 8777), or a free port when that one is taken.
	Port int `json:"port,omitempty"`
	// Replicas of the stream (default 1 embedded, 3 with url) when this
	// node creates it; an existing stream may have more.
	Replicas int `json:"replicas,omitempty"`
	// Stream is the JetStream stream of the op logs (default SBX_EVENTS);
	// SubjectPrefix the prefix of the nodes' subjects (default sbx.ev).
	// Every node and consumer of a cluster must use the same.
	Stream        string `json:"stream,omitempty"`
	SubjectPrefix string `json:"subject_prefix,omitempty"`
	// Disabled turns replication off entirely.
	Disabled bool `json:"disabled,omitempty"`
	// Sync makes API writes wait for the JetStream ack of their events; no
	// ack within sync_timeout_ms (default 5000) answers 503, the change
	// being committed on this node all the same.
	Sync          bool `json:"sync,omitempty"`
	SyncTimeoutMS int  `json:"sync_timeout_ms,omitempty"`
}

// syncTimeout is sync_timeout_ms as a duration.
func (n NATSConfig) syncTimeout() time.Duration {
	if n.SyncTimeoutMS <= 0 {
		return node.DefaultSyncTimeout
	}
	return time.Duration(n.SyncTimeoutMS) * time.Millisecond
}

func (n NATSConfig) validate() error {
	var errs []error
	if n.Port < 0 || n.Port > 65535 {
		errs = append(errs, fmt.Errorf("nats.port %d out of [0, 65535]", n.Port))
	}
	if n.URL != "" && n.Port != 0 {
		errs = append(errs, errors.New("nats.port is the embedded server's; it cannot go with nats.url"))
	}
	// JetStream allows at most 5 replicas.
	if n.Replicas < 0 || n.Replicas > 5 {
		errs = append(errs, fmt.Errorf("nats.replicas %d out of [1, 5]", n.Replicas))
	}
	if n.URL == "" && n.Replicas > 1 {
		errs = append(errs, fmt.Errorf("nats.replicas %d needs a cluster (nats.url): the embedded server is a single node", n.Replicas))
	}
	if n.SyncTimeoutMS < 0 {
		errs = append(errs, fmt.Errorf("nats.sync_timeout_ms %d is negative", n.SyncTimeoutMS))
	}
	if n.Disabled && n.Sync {
		errs = append(errs, errors.New("nats.sync needs replication, which nats.disabled (-no-nats) turns off"))
	}
	if n.URL == "" && !n.Config.IsZero() {
		errs = append(errs, errors.New("nats credentials and TLS settings are for a server at nats.url; the embedded server uses the credentials it generates (<data_dir>/nats.nk)"))
	}
	if err := n.Config.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("nats: %w", err))
	}
	if err := (stream.Config{Name: n.Stream, SubjectPrefix: n.SubjectPrefix}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("nats.stream/subject_prefix: %w", err))
	}
	return errors.Join(errs...)
}

// hostname is os.Hostname (tests replace it).
var hostname = os.Hostname

// defaultNodeID derives a node id from the host name that is its own
// subject token, so the default reads the same in the log, the subject and
// the consumer names: letters, digits, '-' and '_' are kept, every other
// byte becomes '-' ("host.example.com" is "host-example-com"), at most
// stream.MaxNodeID bytes; no host name gives "node-1". A configured
// node_id is kept as it is.
func defaultNodeID(host string) string {
	b := []byte(host)
	for i, c := range b {
		if stream.CheckToken(string(c)) != nil {
			b[i] = '-'
		}
	}
	if len(b) > stream.MaxNodeID {
		b = b[:stream.MaxNodeID]
	}
	if len(b) == 0 {
		return "node-1"
	}
	return string(b)
}

// defaultConfig is what `make run` starts with: one small pool, warm 2.
func defaultConfig() Config {
	return Config{
		Listen:      "127.0.0.1:7777",
		DataDir:     "./data",
		Hypervisor:  "auto",
		RestoreMode: "CopyOnWrite",
		Pools:       []PoolConfig{{Template: "default", Net: "none", Size: "small", Warm: 2}},
		LogLevel:    "info",
	}
}

// loadConfig reads path over the defaults; an empty path means defaults only.
// Unknown keys are an error: a typo must not silently fall back to a default.
func loadConfig(path string) (Config, error) {
	cfg := defaultConfig()
	if path == "" {
		return cfg, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read config: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("parse config %s: %w", path, err)
	}
	return cfg, nil
}

// finish fills derived defaults and validates.
func (c *Config) finish() error {
	var errs []error
	if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %v", c.Listen, err))
	} else if n, err := strconv.ParseUint(port, 10, 16); err != nil && port != "" {
		errs = append(errs, fmt.Errorf("listen %q: port %q: want 0-65535", c.Listen, port))
	} else if n == 0 && port != "0" {
		errs = append(errs, fmt.Errorf("listen %q: no port", c.Listen))
	}
	if err := c.finishPools(); err != nil {
		errs = append(errs, err)
	}
	if c.OwnerAddr == "" {
		c.OwnerAddr = c.Listen
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data_dir is empty"))
	}
	if c.NodeID == "" {
		h, _ := hostname()
		c.NodeID, c.nodeIDFrom = defaultNodeID(h), h
	}
	if err := stream.CheckNodeID(c.NodeID); err != nil {
		errs = append(errs, fmt.Errorf("node_id: %w", err))
	}
	if c.RefillConcurrency == 0 {
		c.RefillConcurrency = min(max(runtime.NumCPU()*2/3, 4), 256)
	}
	if c.RefillConcurrency < 1 || c.RefillConcurrency > 256 {
		errs = append(errs, fmt.Errorf("refill_concurrency %d out of [1, 256]", c.RefillConcurrency))
	}
	switch c.RestoreMode {
	case "CopyOnWrite", "OnDemand", "Copy":
	default:
		errs = append(errs, fmt.Errorf("restore_mode %q: want CopyOnWrite, OnDemand or Copy", c.RestoreMode))
	}
	switch c.Hypervisor {
	case "auto", "cloud-hypervisor", "chsim", "qemu":
	default:
		errs = append(errs, fmt.Errorf("hypervisor %q: want auto, cloud-hypervisor, chsim or qemu", c.Hypervisor))
	}
	if err := c.QEMU.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.HTTP.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.RelayMemoryBytes != 0 && c.RelayMemoryBytes < api.MinRelayMemory {
		errs = append(errs, fmt.Errorf("relay_memory_bytes %d: 0 (the default, %d) or at least %d, what the largest relay reserves", c.RelayMemoryBytes, api.DefaultRelayMemory, api.MinRelayMemory))
	}
	if _, err := c.EgressProxy.ports(); err != nil {
		errs = append(errs, err)
	}
	if c.CheckpointTTLHours < 0 {
		errs = append(errs, fmt.Errorf("checkpoint_ttl_hours must not be negative, got %d", c.CheckpointTTLHours))
	}
	if c.MaxForkCount < 0 {
		errs = append(errs, fmt.Errorf("max_fork_count must be at least 1, got %d", c.MaxForkCount))
	}
	switch c.MetricsAuth {
	case "", api.MetricsAuthRoot, api.MetricsAuthNone:
	default:
		errs = append(errs, fmt.Errorf("metrics_auth %q: want %s or %s", c.MetricsAuth, api.MetricsAuthRoot, api.MetricsAuthNone))
	}
	if err := c.NATS.validate(); err != nil {
		errs = append(errs, err)
	}
	if r := c.VMRestart; r != nil && (r.Max < 0 || r.Max > fsm.MaxRestartHistory || r.WindowSeconds < 0 || (r.Max > 0 && r.WindowSeconds == 0) || r.WindowSeconds > 30*86400) {
		errs = append(errs, fmt.Errorf("vm_restart %+v: max in [0, %d], window_seconds in [1, %d] when max > 0", *r, fsm.MaxRestartHistory, 30*86400))
	}
	for i := range c.Tenants {
		if err := c.Tenants[i].Normalize(); err != nil {
			errs = append(errs, fmt.Errorf("tenants[%d]: %w", i, err))
		}
	}
	if c.LogLevel != "" && !slices.Contains(logLevels, c.LogLevel) {
		errs = append(errs, fmt.Errorf("log_level %q: want %s", c.LogLevel, strings.Join(logLevels, ", ")))
	}
	if c.MaxClaims < 0 {
		errs = append(errs, fmt.Errorf("max_claims %d is negative", c.MaxClaims))
	}
	if err := fsm.ValidVolumeSpecs(c.Volumes); err != nil {
		rej, _ := fsm.AsRejection(err)
		errs = append(errs, fmt.Errorf("volumes: %s", rej.Msg))
	}
	if err := c.validateEgress(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// noDashboard: the config turns the dashboard off ("dashboard": false; absent
// is on).
func (c *Config) noDashboard() bool { return c.Dashboard != nil && !*c.Dashboard }
