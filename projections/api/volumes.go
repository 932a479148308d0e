package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"slices"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// Volumes, with the old daemon's contract: GET /v1/volumes lists the
// catalog entries the caller may use (never their host paths); a claim's
// "volumes" are attached (and mounted, unless volumes_attach_only) before
// its answer, which echoes them; POST .../volumes/attach and .../detach
// change a running sandbox's read-only volumes and answer its whole set.
// The rules (names, mounts, modes, who may use what, a read-write volume
// held by one sandbox: 409) are the state machine's (fsm/volumes.go).

// VolumeJSON is a volume in a claim, an attach, an answer or a sandbox
// row: mode is "rw" or omitted (read-only), mount is omitted for an
// attach-only volume.
type VolumeJSON struct {
	Name  string `json:"name"`
	Mount string `json:"mount,omitempty"`
	Mode  string `json:"mode,omitempty"`
}

// VolumeInfo is one row of GET /v1/volumes.
type VolumeInfo struct {
	Name         string `json:"name"`
	DefaultMount string `json:"default_mount"`
	SizeBytes    int64  `json:"size_bytes"`
	Available    bool   `json:"available"`
	// Nodes counts the nodes that serve the volume: this one, when its
	// backing file is there.
	Nodes    int  `json:"nodes"`
	Writable bool `json:"writable,omitempty"`
}

// AttachVolumesRequest is POST /v1/sandboxes/{id}/volumes/attach's body.
type AttachVolumesRequest struct {
	Volumes []VolumeJSON `json:"volumes"`
}

// DetachVolumesRequest is POST /v1/sandboxes/{id}/volumes/detach's body.
type DetachVolumesRequest struct {
	Names []string `json:"names"`
}

// SandboxVolumes is the answer of attach and detach: the sandbox's volumes.
type SandboxVolumes struct {
	Volumes []VolumeJSON `json:"volumes"`
}

// volumeOutcomes are the events that settle a volume operation, or the
// claim under it.
var volumeOutcomes = []event.Type{event.TypeVolumeAttached, event.TypeVolumeAttachFailed,
	event.TypeVolumeDetached, event.TypeVolumeDetachFailed,
	event.TypeClaimFailed, event.TypeClaimReleased, event.TypeClaimExpired}

func volumeRequests(in []VolumeJSON) []fsm.VolumeRequest {
	if len(in) == 0 {
		return nil
	}
	out := make([]fsm.VolumeRequest, len(in))
	for i, v := range in {
		out[i] = fsm.VolumeRequest{Name: v.Name, Mount: v.Mount, Mode: v.Mode}
	}
	return out
}

// checkVolumes applies the state machine's rules to a claim's volumes
// before anything is proposed.
func checkVolumes(vs []VolumeJSON, attachOnly bool) error {
	if len(vs) == 0 && !attachOnly {
		return nil
	}
	if _, err := fsm.ValidVolumeRequests(volumeRequests(vs), attachOnly); err != nil {
		rej, _ := fsm.AsRejection(err)
		return errorf(http.StatusBadRequest, "%s", rej.Msg)
	}
	return nil
}

// volumesJSON is c's volumes as the API shows them (the attach-only ones
// without a mount, read-only ones without a mode).
func volumesJSON(c *fsm.ClaimRec) []VolumeJSON {
	if len(c.Volumes) == 0 {
		return nil
	}
	out := make([]VolumeJSON, len(c.Volumes))
	for i, v := range c.Volumes {
		out[i] = VolumeJSON{Name: v.Name, Mount: v.Mount}
		if v.RW {
			out[i].Mode = "rw"
		}
	}
	return out
}

// awaitVolumes waits, on w (registered before the proposal), until none of
// claim's volumes named in names (all when nil) is waiting, attaching or
// detaching, or the claim ended, or ctx ends. It returns the errors of the
// operations that failed, from their events.
func (s *Server) awaitVolumes(ctx context.Context, claim string, w *watch, names []string) []string {
	var failed []string
	for {
		s.waitMu.Lock()
		for _, ev := range w.evs {
			p, err := ev.Decode()
			if err != nil {
				continue
			}
			switch p := p.(type) {
			case event.VolumeAttachFailed:
				failed = append(failed, p.Volume+": "+p.Error)
			case event.VolumeDetachFailed:
				failed = append(failed, p.Volume+": "+p.Error)
			}
		}
		w.evs = w.evs[:0]
		s.waitMu.Unlock()
		c, ok := s.claim(claim)
		if !ok || !c.Status.Live() {
			return failed
		}
		busy := slices.ContainsFunc(c.Volumes, func(v fsm.ClaimVolume) bool {
			return v.Status != fsm.VolumeAttached && (names == nil || slices.Contains(names, v.Name))
		})
		if !busy {
			return failed
		}
		select {
		case <-w.signal:
		case <-ctx.Done():
			return failed
		}
	}
}

// handleVolumes is GET /v1/volumes: the catalog entries the caller may use,
// with their backing file's size as this node sees it now.
func (s *Server) handleVolumes(w http.ResponseWriter, _ *http.Request, id auth.Identity) error {
	var specs []fsm.VolumeSpec
	s.eng.View(func(st *fsm.State) { specs = st.Volumes() })
	out := make([]VolumeInfo, 0, len(specs))
	for _, v := range specs {
		if !fsm.VolumeAllowed(v, id.Tenant) {
			continue
		}
		info := VolumeInfo{Name: v.Name, DefaultMount: path.Join(fsm.DefaultVolumeMountDir, v.Name), Writable: v.Writable}
		if st, err := os.Stat(v.Path); err == nil {
			info.SizeBytes, info.Available, info.Nodes = st.Size(), true, 1
		}
		out = append(out, info)
	}
	writeJSON(w, http.StatusOK, map[string][]VolumeInfo{"volumes": out})
	return nil
}

// handleAttachVolumes is POST /v1/sandboxes/{id}/volumes/attach: attach
// read-only volumes to the running sandbox and answer its volumes once
// they are mounted.
func (s *Server) handleAttachVolumes(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req AttachVolumesRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := checkVolumes(req.Volumes, false); err != nil {
		return err
	}
	names := make([]string, len(req.Volumes))
	for i, v := range req.Volumes {
		names[i] = v.Name
	}
	return s.changeVolumes(w, r, id, names, "attach volumes failed; retry the request or detach the volume", func(m fsm.Meta, claim string) fsm.Command {
		return fsm.AttachVolumes{Meta: m, Claim: claim, Volumes: volumeRequests(req.Volumes)}
	})
}

// handleDetachVolumes is POST /v1/sandboxes/{id}/volumes/detach.
func (s *Server) handleDetachVolumes(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	var req DetachVolumesRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	return s.changeVolumes(w, r, id, req.Names, "detach volumes failed; retry the request", func(m fsm.Meta, claim string) fsm.Command {
		return fsm.DetachVolumes{Meta: m, Claim: claim, Names: req.Names}
	})
}

// changeVolumes proposes an attach or detach and answers the sandbox's
// volumes once the operations on names settled: 500 with what failed.
func (s *Server) changeVolumes(w http.ResponseWriter, r *http.Request, id auth.Identity, names []string, failMsg string, cmd func(fsm.Meta, string) fsm.Command) error {
	c, err := s.liveTarget(r, id)
	if err != nil {
		return err
	}
	wt := s.watch(c.ID, volumeOutcomes...)
	defer s.unwatch(wt)
	if _, err := s.eng.ProposeNew(r.Context(), func(m fsm.Meta) fsm.Command { return cmd(m, c.ID) }, engine.Hooks{}); err != nil {
		return s.settled(err, c.ID)
	}
	ctx, cancel := s.waitContext(r.Context(), s.cfg.LifecycleWait)
	defer cancel()
	failed := s.awaitVolumes(ctx, c.ID, wt, names)
	c, _, _, err = s.durableState(r.Context(), c.ID)
	switch {
	case err != nil:
		return err
	case !c.Status.Live():
		return errorf(http.StatusNotFound, "%s", errUnknownSandbox)
	case len(failed) > 0:
		s.zl.Warn().Str("claim", c.ID).Strs("failed", failed).Msg("api: volume operation failed")
		return &httpError{status: http.StatusInternalServerError, id: c.ID, msg: failMsg}
	case c.VolumeOpInFlight():
		return &httpError{status: http.StatusServiceUnavailable, id: c.ID, msg: "volume operation still in flight; retry the request"}
	}
	vs := volumesJSON(&c)
	if vs == nil {
		vs = []VolumeJSON{}
	}
	writeJSON(w, http.StatusOK, SandboxVolumes{Volumes: vs})
	return nil
}

// Instance metadata: the document the guest's agent serves to the
// workload (the old daemon's silkd served it on 169.254.169.254 where an
// image opted in), written into the running guest at InstanceMetadataPath.
const (
	InstanceMetadataPath = "/run/silkd/instance-metadata.json"
	// MaxInstanceMetadata bounds the document.
	MaxInstanceMetadata = 64 << 10
)

// handleInstanceMetadata is PUT /v1/sandboxes/{id}/instance-metadata:
// replace the running sandbox's instance-metadata document (a JSON
// object). A sandbox that is not running is 409 and is not woken.
func (s *Server) handleInstanceMetadata(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	if err := s.operatorOnly(id); err != nil {
		return err
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	doc := bytes.TrimSpace(body)
	switch {
	case len(doc) > MaxInstanceMetadata:
		return errorf(http.StatusBadRequest, "%s: instance metadata is over %d bytes", errInvalidBody, MaxInstanceMetadata)
	case len(doc) == 0 || doc[0] != '{' || !json.Valid(doc):
		return errorf(http.StatusBadRequest, "%s: instance metadata must be a JSON object", errInvalidBody)
	}
	c, err := s.liveTarget(r, id)
	if err != nil {
		return err
	}
	cl, v, _ := s.data.state(c.ID)
	if cl == nil || cl.Status != fsm.ClaimRunning || v == nil || v.Status != fsm.VMClaimed {
		return errorf(http.StatusConflict, "sandbox %s is %s: instance metadata is written to a running sandbox only", c.ID, c.Status)
	}
	nc, err := s.data.dialGuest(r.Context(), guestVM{ID: v.ID, RunDir: v.RunDir})
	if err != nil {
		return errorf(http.StatusBadGateway, "%s", errGuestUnreachable)
	}
	defer nc.Close()
	conn := silkd.NewConn(nc)
	mode := uint32(0o644)
	err = conn.Mkdir(r.Context(), path.Dir(InstanceMetadataPath), true)
	if err == nil {
		err = conn.WriteFile(r.Context(), silkd.FsWrite{Path: InstanceMetadataPath, Mode: &mode}, bytes.NewReader(doc))
	}
	var fe *silkd.Error
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
		return nil
	case errors.As(err, &fe):
		return errorf(http.StatusBadGateway, "writing the instance metadata: %s: %s", fe.Kind, fe.Message)
	}
	return errorf(http.StatusBadGateway, "%s", errGuestUnreachable)
}

// readBody returns the request's body, as decodeBody reads it.
func readBody(r *http.Request) ([]byte, error) {
	if rb, ok := r.Body.(*bufferedBody); ok {
		return rb.b, nil
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, errorf(http.StatusBadRequest, "%s: %v", errInvalidBody, err)
	}
	return b, nil
}
