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
	"slices"
	"sync"

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

// NodeStatus is one node's line of the view.
type NodeStatus struct {
	Node    string         `json:"node"`
	Applied uint64         `json:"applied"` // last sequence folded in
	Warm    map[string]int `json:"warm"`    // pool key -> warm VMs
	Live    int            `json:"live"`    // live claims
	Broken  string         `json:"broken,omitempty"`
}

// View is the cluster view. Its methods are safe for concurrent use.
type View struct {
	dir *Directory
	log zerolog.Logger

	mu    sync.RWMutex
	nodes map[string]*nodeView
}

type nodeView struct {
	st      *fsm.State
	applied uint64
	warm    map[event.PoolKey]int
	broken  error
}

var _ feed.Handler = (*View)(nil)

// NewView returns an empty view. dir may be nil (no addresses: redirect
// answers are then empty).
func NewView(dir *Directory, log zerolog.Logger) *View {
	return &View{dir: dir, log: log.With().Str("component", "cluster-view").Logger(), nodes: map[string]*nodeView{}}
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

// RedirectTargets returns the addresses of live nodes other than self with
// warm VMs for key, most warm first: the body of a redirect answer.
func (v *View) RedirectTargets(key event.PoolKey, self string) []string {
	var out []string
	for _, c := range v.Warm(key) {
		if c.Node == self || v.dir == nil {
			continue
		}
		if a, live := v.dir.Addr(c.Node); live {
			out = append(out, a)
		}
	}
	return out
}

// Nodes returns every node's line, sorted by node id.
func (v *View) Nodes() []NodeStatus {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]NodeStatus, 0, len(v.nodes))
	for _, id := range slices.Sorted(maps.Keys(v.nodes)) {
		n := v.nodes[id]
		ns := NodeStatus{Node: id, Applied: n.applied, Warm: map[string]int{}, Live: n.st.LiveClaims()}
		for k, w := range n.warm {
			ns.Warm[k.String()] = w
		}
		if n.broken != nil {
			ns.Broken = n.broken.Error()
		}
		out = append(out, ns)
	}
	return out
}

// Follow feeds the view from every node's subject (an ephemeral consumer)
// until ctx ends; fo.Durable must be empty and fo.Nodes may limit the nodes.
func (v *View) Follow(ctx context.Context, fo feed.Options) error {
	if fo.Durable != "" {
		return errors.New("cluster: the view follows with an ephemeral consumer (empty Durable)")
	}
	f, err := feed.New(fo, v)
	if err != nil {
		return err
	}
	return f.Run(ctx)
}
