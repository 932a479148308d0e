package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/projections/api"
)

// The VM view follows a checkpoint's capture: its events are the
// checkpoint's, not the VM's or the claim's, and still move the VM into
// checkpointing and back (a view left at checkpointing never quiesces).
func TestVMViewFollowsCheckpoint(t *testing.T) {
	n := newNode(t, 1, func(o *nodetest.Options) { o.Config.CheckpointTTL = 0 })
	sb := claimAs(t, n, rootTok, "")
	changes := stream(t, n, "/v1/events?view=vms", rootTok)
	// Subscribed once the sync is sent: every change after it comes.
	for ev := range changes {
		if ev.Type == "sync" {
			break
		}
	}
	if st, _, b := checkpointOf(t, n, sb, rootTok, `{}`); st != http.StatusOK {
		t.Fatalf("checkpoint: %d %s", st, b)
	}
	var states []string
	timeout := time.After(10 * time.Second)
	for len(states) == 0 || states[len(states)-1] != "claimed" {
		select {
		case ev, ok := <-changes:
			if !ok {
				t.Fatal("VM view ended")
			}
			if ev.Type != "change" {
				continue
			}
			var c api.VMChange
			if err := json.Unmarshal(ev.Data, &c); err != nil {
				t.Fatal(err)
			}
			if c.VM.Name == sb.VM {
				states = append(states, c.VM.State)
			}
		case <-timeout:
			t.Fatalf("VM %s in the view: %v, want checkpointing then claimed", sb.VM, states)
		}
	}
	if len(states) != 2 || states[0] != "checkpointing" {
		t.Fatalf("VM %s in the view: %v, want checkpointing then claimed", sb.VM, states)
	}
}
