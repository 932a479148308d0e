package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
)

// oldStoreFamilies are the old daemon's counters of the store recipes.
var oldStoreFamilies = []string{
	"sandboxd_forks_total", "sandboxd_checkpoints_total", "sandboxd_promotes_total",
	"sandboxd_archives_total", "sandboxd_unarchives_total", "sandboxd_archive_deletes_total",
}

// TestOldStoreMetrics: the old daemon's counters of forks, checkpoints,
// promotes, archives, unarchives and archive deletes count the operations
// that succeeded, from the op log's commits: a fork once (its source
// checkpoint is not a checkpoint of its own), a checkpoint, a promote, two
// archives (a pool's archive_after_seconds), the wake of one (an unarchive)
// and the release of the other (an archive delete).
func TestOldStoreMetrics(t *testing.T) {
	n := newNode(t, 2, func(o *nodetest.Options) { o.Config.Archive = true; o.Config.CheckpointTTL = 0 })
	// A pool that archives a hibernated claim a second after it hibernates.
	if st, b := call(t, n, "PUT", "/v1/pools", rootTok, []byte(`{"pools":[{"template":"default","warm":2,"archive_after_seconds":1}]}`)); st != http.StatusOK {
		t.Fatalf("PUT pools: %d %s", st, b)
	}
	a := claimAs(t, n, rootTok, "")
	for _, c := range []struct{ path, body string }{
		{"/checkpoint", `{}`},
		{"/fork", `{"count":2}`},
		{"/promote", `{"template":"promoted"}`},
	} {
		if st, b := call(t, n, "POST", "/v1/sandboxes/"+a.ID+c.path, rootTok, []byte(c.body)); st != http.StatusOK {
			t.Fatalf("%s: %d %s", c.path, st, b)
		}
	}
	woken, released := claimAs(t, n, rootTok, ""), claimAs(t, n, rootTok, "")
	for _, id := range []string{woken.ID, released.ID} {
		if st, b := call(t, n, "POST", "/v1/sandboxes/"+id+"/hibernate", rootTok, nil); st != http.StatusNoContent {
			t.Fatalf("hibernate: %d %s", st, b)
		}
		waitState(t, n, id, "archived")
	}
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+woken.ID+"/wake", rootTok, nil); st != http.StatusNoContent {
		t.Fatalf("wake: %d %s", st, b)
	}
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+released.ID+"/release", rootTok, nil); st != http.StatusNoContent {
		t.Fatalf("release: %d %s", st, b)
	}
	want := map[string]map[string]float64{}
	for f, v := range map[string]float64{
		"sandboxd_forks_total": 1, "sandboxd_checkpoints_total": 1, "sandboxd_promotes_total": 1,
		"sandboxd_archives_total": 2, "sandboxd_unarchives_total": 1, "sandboxd_archive_deletes_total": 1,
	} {
		want[f] = map[string]float64{"counter {}": v}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		diff := compareFamilies(scrape(t, n, rootTok), want)
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store counters: %s", diff)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
