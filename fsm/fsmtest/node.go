package fsmtest

import (
	"context"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// Node is a node's log and state driven through fsm.Decide with a perfect
// executor, as sandboxd would drive them.
type Node struct {
	t   testing.TB
	ID  string
	Log *eventlog.Log
	St  *fsm.State
	now int64
	n   uint64
}

// NewNode configures the node of the open log l (its node id) and its
// pools, and settles (goldens built, pools refilled).
func NewNode(t testing.TB, l *eventlog.Log, pools ...fsm.PoolSpec) *Node {
	t.Helper()
	s := &Node{t: t, ID: l.NodeID(), Log: l, St: fsm.New(), now: 1_788_220_800_000_000_000}
	s.Do(fsm.ConfigureNode{Meta: s.Meta(), Node: s.ID, Instance: "i-" + s.ID})
	s.Do(fsm.ConfigurePools{Meta: s.Meta(), Pools: pools})
	s.Settle()
	return s
}

// Meta returns a fresh command meta, 1 ms after the previous one.
func (s *Node) Meta() fsm.Meta {
	s.n++
	s.now += 1_000_000
	return fsm.Meta{Op: event.OpIDFromUint(uint64(s.now/1_000_000), s.n), Now: s.now}
}

func (s *Node) result(cause event.OpID) fsm.Meta {
	m := s.Meta()
	m.Op, m.Cause = event.DeriveOpID(cause, "result"), cause
	return m
}

// Do decides cmd, appends the events and applies them.
func (s *Node) Do(cmd fsm.Command) {
	s.t.Helper()
	evs, err := fsm.Decide(s.St, cmd)
	if err != nil {
		s.t.Fatalf("%s: %T: %v", s.ID, cmd, err)
	}
	if len(evs) == 0 {
		return
	}
	res, err := s.Log.Append(context.Background(), evs)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := range res.Events {
		if err := fsm.Apply(s.St, &res.Events[i]); err != nil {
			s.t.Fatal(err)
		}
	}
}

// Settle refills pools and completes every intent successfully.
func (s *Node) Settle() {
	s.t.Helper()
	for range 100 {
		progressed := false
		for _, k := range fsm.RefillsNeeded(s.St) {
			s.Do(fsm.Refill{Meta: s.Meta(), Key: k})
			progressed = true
		}
		for _, in := range fsm.Intents(s.St) {
			switch in := in.(type) {
			case fsm.BuildGolden:
				s.Do(fsm.GoldenBuilt{Meta: s.result(in.OpID), Key: in.Key, SnapshotDir: "golden"})
			case fsm.CloneVM:
				s.Do(fsm.VMCloned{Meta: s.result(in.OpID), VM: in.VM})
			case fsm.DestroyVM:
				s.Do(fsm.VMDestroyed{Meta: s.result(in.OpID), VM: in.VM})
			case fsm.HibernateVM:
				s.Do(fsm.HibernateDone{Meta: s.result(in.OpID), VM: in.VM, SnapshotDir: "snap"})
			case fsm.WakeVM:
				s.Do(fsm.WakeDone{Meta: s.result(in.OpID), VM: in.VM})
			}
			progressed = true
		}
		if !progressed {
			return
		}
	}
	s.t.Fatalf("%s: intents do not settle", s.ID)
}

// Claim claims a sandbox of key and returns its id (unique across nodes).
func (s *Node) Claim(key event.PoolKey) string {
	s.t.Helper()
	id := fmt.Sprintf("sb_%016x", uint64(crc32.ChecksumIEEE([]byte(s.ID)))<<32|s.n)
	s.Do(fsm.Claim{Meta: s.Meta(), ID: id, Key: key})
	return id
}

// Release releases a claim and settles.
func (s *Node) Release(claim string) {
	s.t.Helper()
	s.Do(fsm.Release{Meta: s.Meta(), Claim: claim})
	s.Settle()
}

// Warm is the node's warm VM count for key.
func (s *Node) Warm(key event.PoolKey) int {
	for _, p := range s.St.Info().Pools {
		if p.Key == key {
			return p.Warm
		}
	}
	return 0
}
