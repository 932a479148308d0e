package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// TestSandboxCommands drives claim, get, ls, renew, hibernate, wake and
// release and checks each against the node's state.
func TestSandboxCommands(t *testing.T) {
	n := startNode(t, 2)

	var cl api.ClaimResponse
	mustJSON(t, &cl, "claim", "--template", "default", "--ttl", "10m", "--ref", "job-7", "--meta", "team=a", "--meta", "env=ci")
	rec := claimRec(n, cl.ID)
	if cl.Tier != "warm" || rec.Status != fsm.ClaimRunning || rec.TTLSeconds != 600 || rec.ClaimRef != "job-7" ||
		rec.Metadata["team"] != "a" || rec.Metadata["env"] != "ci" {
		t.Fatalf("claim %+v -> state %+v", cl, rec)
	}
	// The table form, for people.
	out := mustRun(t, "claim", "--template", "default", "--ref", "job-8")
	if !strings.Contains(out, "TIER      warm") || !strings.Contains(out, "TOKEN     sbt_") {
		t.Fatalf("claim table:\n%s", out)
	}
	second := strings.Fields(strings.SplitN(out, "\n", 2)[0])[1]
	if claimRec(n, second).ClaimRef != "job-8" {
		t.Fatalf("table claim id %q not in state", second)
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"ls"}, []string{cl.ID, second}},
		{[]string{"ls", "--ref", "job-7"}, []string{cl.ID}},
		{[]string{"ls", "--meta", "team=a", "--meta", "env=ci"}, []string{cl.ID}},
		{[]string{"ls", "--meta", "team=a", "--meta", "env=prod"}, nil},
		{[]string{"ls", "--state", "hibernated"}, nil},
	} {
		var body struct {
			Sandboxes []api.Sandbox `json:"sandboxes"`
		}
		mustJSON(t, &body, tc.args...)
		var got []string
		for _, s := range body.Sandboxes {
			got = append(got, s.ID)
		}
		if strings.Join(got, ",") != strings.Join(slices.Sorted(slices.Values(tc.want)), ",") {
			t.Errorf("%v: %v, want %v", tc.args, got, tc.want)
		}
	}
	table := mustRun(t, "ls", "--ref", "job-7")
	if lines := strings.Split(strings.TrimSpace(table), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") ||
		!strings.Contains(lines[1], "env=ci,team=a") || !strings.Contains(lines[1], "default/none/small") {
		t.Fatalf("ls table:\n%s", table)
	}

	get := mustRun(t, "get", cl.ID)
	if !strings.Contains(get, "STATE     running") || !strings.Contains(get, "REF       job-7") {
		t.Fatalf("get:\n%s", get)
	}

	// Flags after the id; the sandbox's own token is enough.
	var renewed struct{ ID, Deadline string }
	mustJSON(t, &renewed, "renew", cl.ID, "--ttl", "3600", "--token", cl.Token)
	dl, err := time.Parse(time.RFC3339Nano, renewed.Deadline)
	if err != nil || renewed.ID != cl.ID || time.Unix(0, claimRec(n, cl.ID).Deadline).Sub(dl).Abs() > time.Microsecond {
		t.Fatalf("renew: %+v, %v; state deadline %v", renewed, err, time.Unix(0, claimRec(n, cl.ID).Deadline))
	}

	if out := mustRun(t, "hibernate", "--wait", cl.ID); strings.TrimSpace(out) != cl.ID+": hibernated" {
		t.Fatalf("hibernate --wait: %q", out)
	}
	if s := claimRec(n, cl.ID).Status; s != fsm.ClaimHibernated {
		t.Fatalf("after hibernate --wait: %v", s)
	}
	var woke map[string]string
	mustJSON(t, &woke, "wake", cl.ID, "--wait")
	if woke["state"] != "running" || claimRec(n, cl.ID).Status != fsm.ClaimRunning {
		t.Fatalf("wake --wait: %v, state %v", woke, claimRec(n, cl.ID).Status)
	}
	for _, id := range []string{cl.ID, second} {
		if out := mustRun(t, "release", id); strings.TrimSpace(out) != id+": released" {
			t.Fatalf("release: %q", out)
		}
		if s := claimRec(n, id).Status; s != fsm.ClaimReleased {
			t.Fatalf("after release: %v", s)
		}
	}
	// Hibernating a released sandbox is an error the command reports,
	// saying it was released (410).
	if code, _, errs := sbx("hibernate", cl.ID); code != 1 || !strings.Contains(errs, "410 Gone: sandbox "+cl.ID+" was released at") {
		t.Fatalf("hibernate of a released sandbox: exit %d, %q", code, errs)
	}
	var body struct {
		Sandboxes []api.Sandbox `json:"sandboxes"`
	}
	mustJSON(t, &body, "ls")
	if len(body.Sandboxes) != 0 {
		t.Fatalf("live after release: %+v", body.Sandboxes)
	}
}

// TestHibernateWakeNoWait: hibernate and wake return once the sandbox got
// there; --no-wait once the request is durable, printing the state then.
func TestHibernateWakeNoWait(t *testing.T) {
	n := startNode(t, 1)
	var cl api.ClaimResponse
	mustJSON(t, &cl, "claim", "--template", "default")
	n.Driver.SetDelay(fsm.KindHibernate, 200*time.Millisecond)
	n.Driver.SetDelay(fsm.KindWake, 200*time.Millisecond)
	if out := mustRun(t, "hibernate", cl.ID); strings.TrimSpace(out) != cl.ID+": hibernated" || claimRec(n, cl.ID).Status != fsm.ClaimHibernated {
		t.Fatalf("hibernate: %q, then %v", out, claimRec(n, cl.ID).Status)
	}
	if out := mustRun(t, "wake", cl.ID); strings.TrimSpace(out) != cl.ID+": running" || claimRec(n, cl.ID).Status != fsm.ClaimRunning {
		t.Fatalf("wake: %q, then %v", out, claimRec(n, cl.ID).Status)
	}
	var async map[string]string
	mustJSON(t, &async, "hibernate", "--no-wait", cl.ID)
	if async["state"] != "hibernating" {
		t.Fatalf("hibernate --no-wait: %v", async)
	}
	// Not waiting, a wake during that hibernate is the state's conflict.
	if code, _, errs := sbx("wake", "--no-wait", cl.ID); code != 1 || !strings.Contains(errs, "409") {
		t.Fatalf("wake --no-wait during a hibernate: exit %d, %q", code, errs)
	}
	for deadline := time.Now().Add(10 * time.Second); claimRec(n, cl.ID).Status != fsm.ClaimHibernated; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not hibernated: %v", claimRec(n, cl.ID).Status)
		}
	}
	if out := mustRun(t, "wake", "--no-wait", "--wait", cl.ID); strings.TrimSpace(out) != cl.ID+": running" {
		t.Fatalf("wake --no-wait --wait: %q", out)
	}
}
