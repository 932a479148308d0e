package api_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/executors/transport"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/origin"
)

// fakeFormat is the in-process fake's snapshot format.
var fakeFormat = transport.FormatOf(nodetest.FakeHypervisor)

// originNode is a node "origin" (data dir dir) holding checkpoint ck of a
// tenant a sandbox, with files in its store: the fake captures nothing, so
// the test writes them where the store keeps the checkpoint.
func originNode(t *testing.T) (*nodetest.Node, api.CheckpointRecord, string) {
	t.Helper()
	dir := t.TempDir()
	n := newNode(t, 1, func(o *nodetest.Options) { o.NodeID = "origin"; o.Dir = dir; o.Config.CheckpointTTL = 0 })
	sb := claimAs(t, n, tokA, "")
	st, ck, b := checkpointOf(t, n, sb, tokA, `{"name":"v1"}`)
	if st != http.StatusOK {
		t.Fatalf("checkpoint: %d %s", st, b)
	}
	ckDir := filepath.Join(layout.RootsIn(dir).Store, layout.CheckpointRel(ck.ID))
	writeCheckpointFiles(t, ckDir, ck.ID)
	return n, ck, dir
}

func writeCheckpointFiles(t *testing.T, ckDir, id string) {
	t.Helper()
	if err := os.MkdirAll(ckDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"memory-ranges": strings.Repeat("m", 100_000) + id, "cow.raw": "disk of " + id, "meta.json": `{"version":1}`} {
		if err := os.WriteFile(filepath.Join(ckDir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The blob route streams a checkpoint to the root token only; HEAD probes.
func TestCheckpointBlobRoutes(t *testing.T) {
	n, ck, _ := originNode(t)
	if origin.IDTag(ck.ID) != origin.NodeTag("origin") {
		t.Fatalf("checkpoint id %s does not carry its node's tag %s", ck.ID, origin.NodeTag("origin"))
	}
	blob := "/v1/checkpoints/" + ck.ID + "/blob"
	unknown := "/v1/checkpoints/" + "ck_" + origin.NodeTag("origin") + "000000000000" + "/blob"
	for _, c := range []struct {
		method, path, token string
		want                int
	}{
		{"GET", blob, tokA, http.StatusForbidden},
		{"HEAD", blob, tokA, http.StatusForbidden},
		{"GET", blob, "", http.StatusUnauthorized},
		{"GET", blob, "nope", http.StatusUnauthorized},
		{"GET", unknown, rootTok, http.StatusNotFound},
		{"GET", "/v1/checkpoints/x/blob", rootTok, http.StatusNotFound},
		{"HEAD", unknown, rootTok, http.StatusNotFound},
		{"HEAD", blob, rootTok, http.StatusOK},
	} {
		if st, b := call(t, n, c.method, c.path, c.token, nil); st != c.want {
			t.Errorf("%s %s with %q: %d %s, want %d", c.method, c.path, c.token, st, b, c.want)
		}
	}
	st, b := call(t, n, "GET", blob, rootTok, nil)
	if st != http.StatusOK {
		t.Fatalf("blob: %d %s", st, b)
	}
	into := t.TempDir()
	head, err := transport.Receive(bytes.NewReader(b), into, ck.ID, fakeFormat, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if head.Tenant != "a" || head.SandboxID != ck.SandboxID || head.Name != "v1" || head.Key != defKey || len(head.Files) != 3 {
		t.Fatalf("head %+v", head)
	}
	got, _ := os.ReadFile(filepath.Join(into, "cow.raw"))
	if string(got) != "disk of "+ck.ID {
		t.Fatalf("cow.raw %q", got)
	}
	// A deleted checkpoint is not served.
	if st, b := call(t, n, "DELETE", "/v1/checkpoints/"+ck.ID, tokA, nil); st != http.StatusNoContent {
		t.Fatalf("delete: %d %s", st, b)
	}
	for _, m := range []string{"GET", "HEAD"} {
		if st, _ := call(t, n, m, blob, rootTok, nil); st != http.StatusNotFound {
			t.Errorf("%s of a deleted checkpoint: %d", m, st)
		}
	}
}

// importsOf counts the checkpoint_import_requested events of id in n's log.
func importsOf(t *testing.T, n *nodetest.Node, id string) int {
	t.Helper()
	count, err := nodetest.CountEvents(n.Node, event.TypeCheckpointImportRequested, id)
	if err != nil {
		t.Fatal(err)
	}
	return count
}

// storeLeft lists the entries of a node's store top level and checkpoint dir.
func storeLeft(t *testing.T, dir string) []string {
	t.Helper()
	store := layout.RootsIn(dir).Store
	var out []string
	for _, d := range []string{store, filepath.Join(store, layout.CheckpointStore)} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if !slices.Contains(layout.StoreDirs, e.Name()) && e.Name() != layout.CheckpointStore {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// A claim of another node's checkpoint imports it (once, whoever asks
// concurrently) and is served from the local copy; the node holds it as
// its own afterwards. An origin that holds none is a 404, one that cannot
// be reached a 502; neither leaves anything in the store.
func TestCheckpointClaimImports(t *testing.T) {
	a, ck, aDir := originNode(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	view := laggingView{peers: map[string]string{"origin": strings.TrimPrefix(a.URL, "http://"), "dead": deadAddr}}
	bDir := t.TempDir()
	b := newNode(t, 1, func(o *nodetest.Options) { o.NodeID = "here"; o.Dir = bDir; o.Redirector = view })

	// Three concurrent claims, as tenant b (the id is the capability).
	var wg sync.WaitGroup
	results := make([]api.ClaimResponse, 3)
	statuses := make([]int, 3)
	bodies := make([]string, 3)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, body := call(t, b, "POST", "/v1/checkpoints/"+ck.ID+"/claim", tokB, []byte(`{"ttl_seconds":60}`))
			statuses[i], bodies[i] = st, string(body)
			_ = json.Unmarshal(body, &results[i])
		}()
	}
	wg.Wait()
	for i, st := range statuses {
		if st != http.StatusOK || results[i].FromCheckpoint != ck.ID {
			t.Fatalf("claim %d on the other node: %d %+v %s", i, st, results[i], bodies[i])
		}
	}
	if n := importsOf(t, b, ck.ID); n != 1 {
		t.Fatalf("%d imports for three concurrent claims, want 1", n)
	}
	local := filepath.Join(layout.RootsIn(bDir).Store, layout.CheckpointRel(ck.ID))
	got, err := os.ReadFile(filepath.Join(local, "cow.raw"))
	if err != nil || string(got) != "disk of "+ck.ID {
		t.Fatalf("imported cow.raw %q %v", got, err)
	}
	// Its own now: listed for its tenant, served with the origin's files gone.
	if l := listCheckpoints(t, b, tokA); !slices.Equal(l, []string{ck.ID}) {
		t.Fatalf("tenant a lists %v on the importing node", l)
	}
	if err := os.RemoveAll(filepath.Join(layout.RootsIn(aDir).Store, layout.CheckpointRel(ck.ID))); err != nil {
		t.Fatal(err)
	}
	if st, body := call(t, b, "POST", "/v1/checkpoints/"+ck.ID+"/claim", tokA, nil); st != http.StatusOK {
		t.Fatalf("second claim: %d %s", st, body)
	}
	if n := importsOf(t, b, ck.ID); n != 1 {
		t.Fatalf("a second claim imported again (%d imports)", n)
	}
	if st, _ := call(t, b, "HEAD", "/v1/checkpoints/"+ck.ID+"/blob", rootTok, nil); st != http.StatusOK {
		t.Fatalf("the importing node does not serve it on: %d", st)
	}

	// The origin holds none: 404; unreachable: 502.
	for _, c := range []struct {
		id   string
		want int
		text string
	}{
		{"ck_" + origin.NodeTag("origin") + "000000000000", http.StatusNotFound, "unknown checkpoint"},
		{"ck_" + origin.NodeTag("dead") + "000000000001", http.StatusBadGateway, "unreachable"},
		{"ck_" + origin.NodeTag("never-seen") + "000000000002", http.StatusNotFound, "unknown checkpoint"},
		{"ck_" + origin.NodeTag("here") + "000000000003", http.StatusNotFound, "unknown checkpoint"},
	} {
		st, body := call(t, b, "POST", "/v1/checkpoints/"+c.id+"/claim", tokB, nil)
		if st != c.want || !strings.Contains(string(body), c.text) {
			t.Errorf("claim of %s: %d %s, want %d %q", c.id, st, body, c.want, c.text)
		}
	}
	if left := storeLeft(t, bDir); !slices.Equal(left, []string{ck.ID}) {
		t.Fatalf("store of the importing node holds %v", left)
	}
}
