// Package cluster is the cluster view: which nodes exist and where to reach
// them, how many warm VMs each has per pool key, and which node owns each
// sandbox. sandboxd uses it to answer a claim it cannot serve locally with
// {"redirect": [addrs]} and a request for a sandbox owned elsewhere with the
// owner's address.
//
// Capacity and ownership come from the nodes' op logs: View follows every
// node's subject (an ephemeral feed from the start of the stream) and folds
// each node's events into that node's own fsm.State, so its numbers are the
// ones the node itself computes, a replication lag behind. Addresses are not
// events: each node announces its owner_addr in a JetStream KV bucket
// (DefaultBucket) with a heartbeat, and Directory watches it, so a node
// that stopped beating is no redirect target even though its log lives on.
//
// A node whose events the local state machine cannot apply (a newer event
// type, a divergent log) is marked broken and left out of capacity and
// redirects rather than stopping the whole view.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/fsm"
)

// Redirect is the old daemon's reply to a claim served elsewhere.
type Redirect struct {
	Redirect []string `json:"redirect"`
}

// Capacity is one node's warm VMs for a pool key.
type Capacity struct {
	Node string `json:"node"`
	Warm int    `json:"warm"`
}

// NodeStatus is one node's line of the view: its log as folded in, and its
// liveness as the directory judges it.
type NodeStatus struct {
	Node    string         `json:"node"`
	Applied uint64         `json:"applied"` // last sequence folded in
	Warm    map[string]int `json:"warm"`    // pool key -> warm VMs
	Claims  int            `json:"claims"`  // live claims
	Broken  string         `json:"broken,omitempty"`
	// Addr is the node's announced owner_addr ("" when never seen).
	Addr string `json:"addr,omitempty"`
	// Live: announcing within the TTL and not withdrawn (a redirect
	// target when it has capacity).
	Live bool `json:"live"`
	// Withdrawn: the node withdrew its address as it stopped.
	Withdrawn bool `json:"withdrawn,omitempty"`
	// LastSeen is the local time of its last heartbeat (RFC 3339).
	LastSeen string `json:"last_seen,omitempty"`
	// TenantDigest fingerprints its tenant set (fsm.TenantDigest).
	TenantDigest string `json:"tenant_digest"`
}

// View is the cluster view. Its methods are safe for concurrent use.
type View struct {
	dir *Directory
	log zerolog.Logger

	mu      sync.RWMutex
	nodes   map[string]*nodeView
	intN    func(n int) int
	feed    *feed.Feed
	tenants uint64 // bumped by every tenant event folded in
}

type nodeView struct {
	st      *fsm.State
	applied uint64
	warm    map[event.PoolKey]int
	broken  error
	// tenantVer is the version of the node's tenant set: its last API
	// tenant change (or the origin of the last one it adopted).
	tenantVer TenantVersion
}

// TenantVersion orders tenant sets across the fleet: the node whose API
// made the change and that node's event time; later times win, ties by
// node id. Zero: the set was never changed through an API.
type TenantVersion struct {
	Node string `json:"node"`
	Time int64  `json:"time"`
}

// Less orders versions.
func (a TenantVersion) Less(b TenantVersion) bool {
	return cmp.Or(cmp.Compare(a.Time, b.Time), cmp.Compare(a.Node, b.Node)) < 0
}

// IsZero reports a set never changed through an API.
func (a TenantVersion) IsZero() bool { return a == TenantVersion{} }

// TenantSet is one node's tenant set as the view folded it.
type TenantSet struct {
	Node    string
	Version TenantVersion
	Tenants []fsm.TenantRec
	Digest  string
	// Applied is the node's last sequence folded in.
	Applied uint64
}

var _ feed.Handler = (*View)(nil)

// NewView returns an empty view. dir may be nil (no addresses: redirect
// answers are then empty).
func NewView(dir *Directory, log zerolog.Logger) *View {
	return &View{dir: dir, log: log.With().Str("component", "cluster-view").Logger(), nodes: map[string]*nodeView{}, intN: rand.IntN}
}

// SetRand replaces the random source of placement (tests inject a seeded
// one): intN returns a uniform int in [0, n).
func (v *View) SetRand(intN func(n int) int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.intN = intN
}

// Position implements feed.Handler.
func (v *View) Position(node string) uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if n := v.nodes[node]; n != nil {
		return n.applied
	}
	return 0
}

// Apply implements feed.Handler: it folds the events into their nodes'
// states. It never fails; a node whose events do not apply is marked broken.
func (v *View) Apply(_ context.Context, evs []event.Event) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	touched := map[*nodeView]bool{}
	for i := range evs {
		ev := &evs[i]
		n := v.nodes[ev.Node]
		if n == nil {
			n = &nodeView{st: fsm.New(), warm: map[event.PoolKey]int{}}
			v.nodes[ev.Node] = n
		}
		n.applied = ev.Seq
		if n.broken != nil {
			continue
		}
		if err := fsm.Apply(n.st, ev); err != nil {
			n.broken = err
			v.log.Error().Err(err).Str("node", ev.Node).Uint64("seq", ev.Seq).Msg("cannot apply a node's event; leaving the node out of the cluster view")
			clear(n.warm)
			continue
		}
		if ver, ok := TenantVersionOf(ev); ok {
			n.tenantVer = ver
			v.tenants++
		}
		touched[n] = true
	}
	for n := range touched {
		if n.broken != nil {
			continue
		}
		clear(n.warm)
		for _, p := range n.st.Info().Pools {
			if p.Warm > 0 {
				n.warm[p.Key] = p.Warm
			}
		}
	}
	return nil
}

// TenantVersionOf returns the version an API tenant event gives its node's
// set: its origin's when adopted, else its own node and time. Config
// events (a node's config seeding its own set) give none.
func TenantVersionOf(ev *event.Event) (TenantVersion, bool) {
	if ev.Type != event.TypeTenantPut && ev.Type != event.TypeTenantRemoved {
		return TenantVersion{}, false
	}
	p, err := event.DecodePayload(ev.Type, ev.Version, ev.Payload)
	if err != nil {
		return TenantVersion{}, false
	}
	var config bool
	var origin *event.TenantOrigin
	switch p := p.(type) {
	case event.TenantPut:
		config, origin = p.Config, p.Origin
	case event.TenantRemoved:
		config, origin = p.Config, p.Origin
	}
	switch {
	case config:
		return TenantVersion{}, false
	case origin != nil:
		return TenantVersion{Node: origin.Node, Time: origin.Time}, true
	}
	return TenantVersion{Node: ev.Node, Time: ev.Time}, true
}

// Warm returns the nodes with warm VMs for key, most first (ties by node
// id), broken nodes left out.
func (v *View) Warm(key event.PoolKey) []Capacity {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []Capacity
	for id, n := range v.nodes {
		if w := n.warm[key]; w > 0 && n.broken == nil {
			out = append(out, Capacity{Node: id, Warm: w})
		}
	}
	slices.SortFunc(out, func(a, b Capacity) int {
		return cmp.Or(cmp.Compare(b.Warm, a.Warm), cmp.Compare(a.Node, b.Node))
	})
	return out
}

// Owner returns the node whose log holds claim (live, or ended and still
// retained by the state machine).
func (v *View) Owner(claim string) (string, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, id := range slices.Sorted(maps.Keys(v.nodes)) {
		if n := v.nodes[id]; n.broken == nil {
			if _, ok := n.st.Claim(claim); ok {
				return id, true
			}
		}
	}
	return "", false
}

// ErrNoAddress: the owner is known but has no live address.
var ErrNoAddress = errors.New("cluster: node has no live address")

// OwnerAddr returns the address of claim's owner (ok false when no node
// holds it; ErrNoAddress when the owner is not announcing).
func (v *View) OwnerAddr(claim string) (node, addr string, ok bool, err error) {
	node, ok = v.Owner(claim)
	if !ok {
		return "", "", false, nil
	}
	if v.dir != nil {
		if a, live := v.dir.Addr(node); live {
			return node, a, true, nil
		}
	}
	return node, "", true, ErrNoAddress
}

// Owner is what the view knows of a sandbox's owner.
type Owner struct {
	Node string
	// Entry is the directory's word on the node (zero Addr: never seen).
	Entry
}

// OwnerOf returns claim's owner and its liveness (ok false when no node
// holds the claim).
func (v *View) OwnerOf(claim string) (Owner, bool) {
	node, ok := v.Owner(claim)
	if !ok {
		return Owner{}, false
	}
	o := Owner{Node: node}
	if v.dir != nil {
		o.Entry, _ = v.dir.Lookup(node)
	}
	return o, true
}

// MaxRedirect is the most nodes a redirect names (the old contract's).
const MaxRedirect = 2

// RedirectTargets returns the body of a redirect answer for key: at most
// MaxRedirect addresses of live nodes other than self with warm VMs for
// it, chosen by power-of-two-choices: two candidates at random, the one
// with more warm VMs first (a tie in random order).
func (v *View) RedirectTargets(key event.PoolKey, self string) []string {
	if v.dir == nil {
		return nil
	}
	var cands []Capacity
	addrs := map[string]string{}
	for _, c := range v.Warm(key) {
		if c.Node == self {
			continue
		}
		if a, live := v.dir.Addr(c.Node); live {
			cands = append(cands, c)
			addrs[c.Node] = a
		}
	}
	v.mu.Lock()
	intN := v.intN
	v.mu.Unlock()
	picked := pickTwo(cands, intN)
	out := make([]string, len(picked))
	for i, c := range picked {
		out[i] = addrs[c.Node]
	}
	return out
}

// pickTwo is power-of-two-choices over cands: two distinct at random (all
// of them when there are fewer), more warm first, a tie in random order.
func pickTwo(cands []Capacity, intN func(int) int) []Capacity {
	switch len(cands) {
	case 0:
		return nil
	case 1:
		return cands
	}
	i := intN(len(cands))
	j := intN(len(cands) - 1)
	if j >= i {
		j++
	}
	a, b := cands[i], cands[j]
	if b.Warm > a.Warm || (b.Warm == a.Warm && intN(2) == 1) {
		a, b = b, a
	}
	return []Capacity{a, b}
}

// Nodes returns every node's line, sorted by node id: the nodes whose logs
// the view folded and those only the directory knows.
func (v *View) Nodes() []NodeStatus {
	entries := map[string]Entry{}
	if v.dir != nil {
		for _, e := range v.dir.Entries() {
			entries[e.Node] = e
		}
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	ids := slices.Collect(maps.Keys(v.nodes))
	for id := range entries {
		if v.nodes[id] == nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]NodeStatus, 0, len(ids))
	for _, id := range ids {
		ns := NodeStatus{Node: id, Warm: map[string]int{}, TenantDigest: fsm.TenantDigest(nil)}
		if n := v.nodes[id]; n != nil {
			ns.Applied, ns.Claims, ns.TenantDigest = n.applied, n.st.LiveClaims(), fsm.TenantDigest(n.st.Tenants())
			for k, w := range n.warm {
				ns.Warm[k.String()] = w
			}
			if n.broken != nil {
				ns.Broken = n.broken.Error()
			}
		}
		if e, ok := entries[id]; ok {
			ns.Addr, ns.Live, ns.Withdrawn = e.Addr, e.Live, e.Withdrawn
			ns.LastSeen = e.LastSeen.UTC().Format(time.RFC3339Nano)
		}
		out = append(out, ns)
	}
	return out
}

// TenantGen changes whenever a tenant event of any node is folded in.
func (v *View) TenantGen() uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.tenants
}

// TenantSets returns every healthy node's tenant set, sorted by node id.
func (v *View) TenantSets() []TenantSet {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []TenantSet
	for _, id := range slices.Sorted(maps.Keys(v.nodes)) {
		n := v.nodes[id]
		if n.broken != nil {
			continue
		}
		recs := n.st.Tenants()
		out = append(out, TenantSet{Node: id, Version: n.tenantVer, Tenants: recs, Digest: fsm.TenantDigest(recs), Applied: n.applied})
	}
	return out
}

// NewestTenants returns the set with the newest version among sets (ok
// false when none was ever changed through an API).
func NewestTenants(sets []TenantSet) (TenantSet, bool) {
	var best TenantSet
	for _, s := range sets {
		if best.Version.Less(s.Version) {
			best = s
		}
	}
	return best, !best.Version.IsZero()
}

// Behind reports whether the view may miss recent events of a node other
// than self, so that "no node holds this sandbox" is not to be trusted:
// its feed is not delivering (interrupted, re-creating its consumer,
// catching up), or a live node announced a log position beyond what the
// view folded of it (its events not in the stream yet, or not delivered).
// It says since when (zero when not behind).
func (v *View) Behind(self string) (bool, time.Time) {
	v.mu.RLock()
	f := v.feed
	v.mu.RUnlock()
	if f != nil {
		if st := f.Status(); st.State != "running" {
			return true, st.Since
		}
	}
	if v.dir == nil {
		return false, time.Time{}
	}
	for _, e := range v.dir.Entries() {
		if e.Live && e.Node != self && e.Seq > v.Position(e.Node) {
			return true, e.LastSeen
		}
	}
	return false, time.Time{}
}

// ViewHeartbeat is the idle heartbeat of the view's consumer: two missed
// heartbeats end the consumer's session and the feed re-creates it (after
// the last message delivered) on a server that is up.
const ViewHeartbeat = 500 * time.Millisecond

// Follow feeds the view from every node's subject (an ephemeral consumer)
// until ctx ends; fo.Durable must be empty and fo.Nodes may limit the nodes.
func (v *View) Follow(ctx context.Context, fo feed.Options) error {
	if fo.Durable != "" {
		return errors.New("cluster: the view follows with an ephemeral consumer (empty Durable)")
	}
	// The view must notice a lost consumer (its NATS server gone) within
	// about a second, not the client's default of tens of seconds.
	if fo.Heartbeat == 0 {
		fo.Heartbeat = ViewHeartbeat
	}
	if fo.MaxBackoff == 0 {
		fo.MaxBackoff = 2 * fo.Heartbeat
	}
	// A gap is retried, not the view's end: Behind says so meanwhile.
	fo.RetryGaps = true
	// Through the loss of the server that led the JetStream meta group,
	// the consumer cannot be made again until the group elects a leader;
	// the stream's surviving replicas answer direct gets meanwhile.
	fo.DirectReads = true
	f, err := feed.New(fo, v)
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.feed = f
	v.mu.Unlock()
	return f.Run(ctx)
}
