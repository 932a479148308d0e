package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
)

// awaitState polls the node until claim id is in want.
func awaitState(t *testing.T, n interface {
	View(func(*fsm.State))
}, id string, want fsm.ClaimStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		var st fsm.ClaimStatus
		n.View(func(s *fsm.State) {
			if c, ok := s.Claim(id); ok {
				st = c.Status
			}
		})
		if st == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("claim %s is %s, want %s", id, st, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Release of an expired sandbox says so instead of "released" (issue 25
// item 10); several IDs; --all releases every live one; ls --state all
// lists live and ended with EXPIRES IN.
func TestReleaseSaysWhatHappened(t *testing.T) {
	n := startNode(t, 3)
	short := claimOne(t)
	var expiring struct{ ID string }
	mustJSON(t, &expiring, "claim", "--template", "default", "--ttl", "1")
	awaitState(t, n.Engine, expiring.ID, fsm.ClaimExpired)
	// exec of it (root: sbxctl gets the token) says it expired and when (issue 25 item 4: exec
	// said 404 unknown sandbox while get said expired).
	if code, _, errs := sbx("exec", expiring.ID, "--", "true"); code != 1 || !strings.Contains(errs, "410") || !strings.Contains(errs, "expired at") {
		t.Fatalf("exec of an expired sandbox: exit %d, %q", code, errs)
	}
	out := mustRun(t, "release", expiring.ID)
	if !strings.HasPrefix(out, expiring.ID+": already expired at ") || !strings.Contains(out, "nothing to release") {
		t.Fatalf("release of an expired sandbox: %q", out)
	}
	ls := mustRun(t, "ls", "--state", "all")
	lines := strings.Split(strings.TrimSpace(ls), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], "EXPIRES IN") {
		t.Fatalf("ls --state all:\n%s", ls)
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		switch f[0] {
		case expiring.ID:
			if f[1] != "expired" || f[len(f)-1] != "-" {
				t.Fatalf("expired row %q", l)
			}
		case short.ID:
			if d, err := time.ParseDuration(f[len(f)-1]); f[1] != "running" || err != nil || d <= 4*time.Minute || d > 5*time.Minute {
				t.Fatalf("live row %q: want it to expire in about 5m (the default TTL)", l)
			}
		default:
			t.Fatalf("row %q", l)
		}
	}
	second := claimOne(t)
	out = mustRun(t, "release", "--all")
	if !strings.Contains(out, short.ID+": released\n") || !strings.Contains(out, second.ID+": released\n") || !strings.HasSuffix(out, "2 sandbox(es) released\n") {
		t.Fatalf("release --all:\n%s", out)
	}
	if code, _, errs := sbx("release", "--all", short.ID); code != 2 || !strings.Contains(errs, "not both") {
		t.Fatalf("--all with an ID: %d %q", code, errs)
	}
	if code, _, errs := sbx("release"); code != 2 || !strings.Contains(errs, "at least one ID") {
		t.Fatalf("no ID: %d %q", code, errs)
	}
}

// down releases everything and drains: no VM is left, the node stays
// drained, and a claim then says how to end the drain.
func TestDown(t *testing.T) {
	n := startNode(t, 2)
	a, b := claimOne(t), claimOne(t)
	out := mustRun(t, "down")
	if !strings.HasPrefix(out, "2 sandbox(es) released, node drained") || !strings.Contains(out, "sbxctl uncordon") {
		t.Fatalf("down:\n%s", out)
	}
	var live, warm int
	n.Engine.View(func(st *fsm.State) {
		in := st.Info()
		live = st.LiveClaims()
		for _, p := range in.Pools {
			warm += p.Warm
		}
	})
	if live != 0 || warm != 0 || claimRec(n, a.ID).Status != fsm.ClaimReleased || claimRec(n, b.ID).Status != fsm.ClaimReleased {
		t.Fatalf("after down: %d live, %d warm", live, warm)
	}
	code, _, errs := sbx("claim", "--template", "default")
	if code != 1 || !strings.Contains(errs, "429") || !strings.Contains(errs, "sbxctl uncordon") {
		t.Fatalf("claim after down: exit %d, %q", code, errs)
	}
}
