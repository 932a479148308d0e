package api_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// The volume routes with the old contract: the catalog per caller, a
// claim's volumes echoed once attached, a read-write volume refused to a
// second sandbox (409), live attach and detach with the sandbox's token,
// their refusals, and instance metadata for root only.
func TestVolumesAPI(t *testing.T) {
	dir := t.TempDir()
	img := func(name string) string {
		p := filepath.Join(dir, name+".img")
		if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	n := newNode(t, 3, func(o *nodetest.Options) {
		o.Volumes = []fsm.VolumeSpec{
			{Name: "imagenet", Path: img("imagenet")},
			{Name: "weights", Path: img("weights"), Tenants: []string{"a"}},
			{Name: "scratch", Path: img("scratch"), Writable: true},
			{Name: "gone", Path: filepath.Join(dir, "missing.img")},
		}
	})

	// The catalog: root sees all, tenant b not the one for a; no paths.
	for _, tc := range []struct {
		tok  string
		want []string
	}{{rootTok, []string{"gone", "imagenet", "scratch", "weights"}}, {tokB, []string{"gone", "imagenet", "scratch"}}} {
		st, b := call(t, n, "GET", "/v1/volumes", tc.tok, nil)
		var got struct{ Volumes []api.VolumeInfo }
		if st != http.StatusOK || json.Unmarshal(b, &got) != nil || strings.Contains(string(b), dir) {
			t.Fatalf("GET /v1/volumes: %d %s", st, b)
		}
		var names []string
		for _, v := range got.Volumes {
			names = append(names, v.Name)
			if v.Name == "gone" && (v.Available || v.Nodes != 0) || v.Name == "imagenet" && (!v.Available || v.SizeBytes != 4096 || v.DefaultMount != "/volumes/imagenet") {
				t.Errorf("volume %+v", v)
			}
			if v.Writable != (v.Name == "scratch") {
				t.Errorf("volume %+v: writable", v)
			}
		}
		if strings.Join(names, ",") != strings.Join(tc.want, ",") {
			t.Fatalf("catalog %v, want %v", names, tc.want)
		}
	}

	// A claim with volumes is answered with them attached.
	cr := claimAs(t, n, rootTok, `,"volumes":[{"name":"imagenet"},{"name":"scratch","mode":"rw","mount":"/data"}]`)
	if len(cr.Volumes) != 2 || cr.Volumes[0] != (api.VolumeJSON{Name: "imagenet", Mount: "/volumes/imagenet"}) ||
		cr.Volumes[1] != (api.VolumeJSON{Name: "scratch", Mount: "/data", Mode: "rw"}) {
		t.Fatalf("claim volumes %+v", cr.Volumes)
	}
	var sb api.Sandbox
	if st, b := call(t, n, "GET", "/v1/sandboxes/"+cr.ID, rootTok, nil); st != http.StatusOK || json.Unmarshal(b, &sb) != nil || len(sb.Volumes) != 2 {
		t.Fatalf("sandbox row: %d %s", st, b)
	}
	// The read-write volume is this sandbox's alone.
	if st, b := call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"default","volumes":[{"name":"scratch"}]}`)); st != http.StatusConflict || !strings.Contains(string(b), "volume busy") {
		t.Fatalf("second claim of a held rw volume: %d %s", st, b)
	}
	// Tenant b may not use weights: the same 400 as an unknown volume.
	if st, b := call(t, n, "POST", "/v1/claim", tokB, []byte(`{"template":"default","volumes":[{"name":"weights"}]}`)); st != http.StatusBadRequest || !strings.Contains(string(b), "unknown or not available") {
		t.Fatalf("forbidden volume: %d %s", st, b)
	}

	// Live attach and detach, with the sandbox's token.
	attach := func(tok, body string) (int, []byte) {
		return call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/volumes/attach", tok, []byte(body))
	}
	st, b := attach(cr.Token, `{"volumes":[{"name":"weights","mount":"/models"}]}`)
	var set api.SandboxVolumes
	if st != http.StatusOK || json.Unmarshal(b, &set) != nil || len(set.Volumes) != 3 || set.Volumes[2] != (api.VolumeJSON{Name: "weights", Mount: "/models"}) {
		t.Fatalf("attach: %d %s", st, b)
	}
	for _, tc := range []struct {
		body string
		code int
	}{
		{`{"volumes":[{"name":"gone","mode":"rw"}]}`, http.StatusBadRequest},         // live attach is read-only
		{`{"volumes":[{"name":"gone","mount":"/data/x"}]}`, http.StatusBadRequest},   // nests in /data
		{`{"volumes":[{"name":"weights","mount":"/other"}]}`, http.StatusBadRequest}, // another mount
		{`{"volumes":[{"name":"nope"}]}`, http.StatusBadRequest},
		{`{"volumes":[{"name":"imagenet"}],"x":1}`, http.StatusBadRequest},
	} {
		if st, b := attach(cr.Token, tc.body); st != tc.code {
			t.Errorf("attach %s: %d %s, want %d", tc.body, st, b, tc.code)
		}
	}
	if st, _ := attach(tokA, `{"volumes":[]}`); st != http.StatusForbidden {
		t.Errorf("attach with a tenant token: %d", st)
	}
	if st, b := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/volumes/detach", cr.Token, []byte(`{"names":["scratch"]}`)); st != http.StatusBadRequest {
		t.Errorf("detach of a rw volume: %d %s", st, b)
	}
	st, b = call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/volumes/detach", rootTok, []byte(`{"names":["weights","imagenet"]}`))
	if st != http.StatusOK || json.Unmarshal(b, &set) != nil || len(set.Volumes) != 1 || set.Volumes[0].Name != "scratch" {
		t.Fatalf("detach: %d %s", st, b)
	}
	if calls := n.Driver.Calls(); calls[fsm.KindAttachVolume] != 3 || calls[fsm.KindDetachVolume] != 2 {
		t.Fatalf("driver calls %v", calls)
	}

	// Instance metadata: root only, a JSON object.
	md := "/v1/sandboxes/" + cr.ID + "/instance-metadata"
	if st, b := call(t, n, "PUT", md, rootTok, []byte(`{"region":"local","tags":["a"]}`)); st != http.StatusNoContent {
		t.Fatalf("instance metadata: %d %s", st, b)
	}
	for _, body := range []string{`[1]`, `{"a":`, ``} {
		if st, _ := call(t, n, "PUT", md, rootTok, []byte(body)); st != http.StatusBadRequest {
			t.Errorf("instance metadata %q: %d", body, st)
		}
	}
	if st, _ := call(t, n, "PUT", md, tokA, []byte(`{}`)); st != http.StatusForbidden {
		t.Errorf("instance metadata as a tenant: %d", st)
	}

	// Released, its VM gone: the read-write volume is free again.
	if st, _ := call(t, n, "POST", "/v1/sandboxes/"+cr.ID+"/release", cr.Token, nil); st != http.StatusNoContent {
		t.Fatal("release")
	}
	settle(t, n)
	claimAs(t, n, rootTok, `,"volumes":[{"name":"scratch","mode":"rw"}]`)
}

// A claim whose volume cannot be attached fails as a provisioning failure.
func TestVolumeClaimAttachFails(t *testing.T) {
	p := filepath.Join(t.TempDir(), "v.img")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, 1, func(o *nodetest.Options) { o.Volumes = []fsm.VolumeSpec{{Name: "v", Path: p}} })
	n.Driver.FailAttaches.Store(true)
	st, b := call(t, n, "POST", "/v1/claim", rootTok, []byte(`{"template":"default","volumes":[{"name":"v"}]}`))
	if st != http.StatusInternalServerError || !strings.Contains(string(b), "volume_failed") {
		t.Fatalf("claim: %d %s", st, b)
	}
}
