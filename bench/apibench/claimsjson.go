package apibench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
)

// oldClaim is a live claim as the old daemon kept it in claims.json: the
// pool key, the VM and its network, the lease and the hashed token.
type oldClaim struct {
	ID        string            `json:"id"`
	Template  string            `json:"template"`
	Net       string            `json:"net"`
	Size      string            `json:"size"`
	VM        string            `json:"vm"`
	Tap       string            `json:"tap"`
	IP        string            `json:"ip"`
	Tenant    string            `json:"tenant,omitempty"`
	ClaimRef  string            `json:"claim_ref,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	TokenHash string            `json:"token_hash"`
	Created   time.Time         `json:"created"`
	Deadline  time.Time         `json:"deadline"`
	State     string            `json:"state"`
}

// claimStore is the old daemon's store: every commit rewrites the whole map.
type claimStore struct {
	path  string
	fsync bool

	mu     sync.Mutex // guards claims and vmSeq
	claims map[string]*oldClaim
	vmSeq  int

	writeMu sync.Mutex // serialises commits, as the old writeMu did
}

// commit writes a snapshot of the map as claims.json: clone under the map
// lock, then marshal, write a temp file, (fsync,) rename (, fsync the dir).
func (s *claimStore) commit() error {
	s.mu.Lock()
	snap := maps.Clone(s.claims)
	s.mu.Unlock()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	data, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if s.fsync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return err
	}
	if s.fsync {
		d, err := os.Open(filepath.Dir(s.path))
		if err != nil {
			return err
		}
		defer d.Close()
		return d.Sync()
	}
	return nil
}

func (s *claimStore) newClaim(req *api.ClaimRequest, now time.Time) (*oldClaim, string) {
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		panic(err)
	}
	token := hex.EncodeToString(tok[:])
	h := sha256.Sum256([]byte(token))
	s.vmSeq++
	c := &oldClaim{
		ID: newClaimID(), Template: req.Template, Net: req.Net, Size: req.Size,
		VM:  fmt.Sprintf("vm-%012x", s.vmSeq),
		Tap: fmt.Sprintf("tap%d", s.vmSeq%100000), IP: fmt.Sprintf("10.%d.%d.%d", s.vmSeq>>16&255, s.vmSeq>>8&255, s.vmSeq&255),
		ClaimRef: req.ClaimRef, Metadata: req.Metadata, TokenHash: hex.EncodeToString(h[:]),
		Created: now, Deadline: now.Add(time.Duration(max(req.TTLSeconds, 300)) * time.Second), State: "running",
	}
	return c, token
}

// ServeHTTP is the old daemon's POST /v1/claim: decode, take a warm VM,
// record the claim, commit claims.json, answer.
func (s *claimStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req api.ClaimRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, api.MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Template == "" {
		http.Error(w, `{"error":"invalid request body"}`, http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	c, token := s.newClaim(&req, time.Now())
	s.claims[c.ID] = c
	s.mu.Unlock()
	if err := s.commit(); err != nil {
		http.Error(w, fmt.Sprintf(`{"error":%q}`, err.Error()), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(api.ClaimResponse{
		ID: c.ID, Token: token, Deadline: c.Deadline.UTC().Format(time.RFC3339Nano), OwnerAddr: r.Host,
		Template: c.Template, Net: c.Net, Size: c.Size, Tier: "warm", VM: c.VM,
	})
}

// startClaimsJSON serves the comparator with live claims already in its map
// (and on disk).
func startClaimsJSON(dir string, live int, fsync bool) (*system, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	st := &claimStore{path: filepath.Join(dir, "claims.json"), fsync: fsync, claims: make(map[string]*oldClaim, live)}
	now := time.Now()
	req := api.ClaimRequest{Template: "default", Net: "none", Size: "small", TTLSeconds: 3600, ClaimRef: "job-0000", Metadata: map[string]string{"owner": "bench"}}
	for i := 0; i < live; i++ {
		c, _ := st.newClaim(&req, now)
		st.claims[c.ID] = c
	}
	if err := st.commit(); err != nil {
		return nil, err
	}
	url, closeFn, err := listen(st)
	if err != nil {
		return nil, err
	}
	mode := "no (old default)"
	if fsync {
		mode = "yes"
	}
	return &system{
		name: jsonName, fsync: mode, live: live, url: url, close: closeFn,
		release: func(_ context.Context, ids []string) error {
			st.mu.Lock()
			defer st.mu.Unlock()
			for _, id := range ids {
				delete(st.claims, id)
			}
			return nil
		},
	}, nil
}
