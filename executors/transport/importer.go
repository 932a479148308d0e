package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/layout"
	"github.com/sbxlog/sbxlog/fsm"
)

// Step names of the import recipe, as ExecReport.Steps and the Hook see
// them.
const (
	StepCheck     = "check"      // the op's import already under the final name?
	StepMkTemp    = "mktemp"     // temp dir inside the store
	StepFetch     = "fetch"      // GET the blob, files written, fsynced, verified
	StepMarker    = "marker"     // the import's marker (op, head), written atomically
	StepSyncFiles = "sync_files" // SyncTree of the temp dir
	StepRename    = "rename"     // temp dir to checkpoint/<id>
	StepSyncTree  = "sync_tree"  // SyncTree of the final dir
)

// DefaultMaxBytes caps one checkpoint's files (Config.MaxBytes).
const DefaultMaxBytes = 256 << 30

// Config configures a node's imports.
type Config struct {
	Roots layout.Roots
	// Format is this node's snapshot format (FormatOf its hypervisor).
	Format string
	// Token authenticates this node at its peers' blob routes: the
	// fleet's root token (every node of a fleet shares it).
	Token string
	// MaxBytes caps one checkpoint's files (default DefaultMaxBytes).
	MaxBytes int64
	// Client fetches blobs (default: a client with a dial and
	// response-header bound; the body's length has no time bound but the
	// attempt's).
	Client *http.Client
	// FS performs the store's steps (default fsx.NewOS).
	FS fsx.FS
	// Hook, if set, runs before every step; an error fails the step as if
	// it had failed (crash tests).
	Hook func(ctx context.Context, step string, op event.OpID) error
	// Now times the steps (default time.Now).
	Now func() time.Time
	Log zerolog.Logger
}

// Receiver performs fsm.FetchCheckpoint for a driver (executors.
// CheckpointImporter): a driver embeds it, and the node configures it
// (UseTransport) once it knows its roots, format and token. Unconfigured,
// it refuses every import.
type Receiver struct{ c atomic.Pointer[Config] }

var _ executors.CheckpointImporter = (*Receiver)(nil)

// UseTransport configures the receiver.
func (r *Receiver) UseTransport(c Config) {
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			ResponseHeaderTimeout: 30 * time.Second,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       30 * time.Second,
		}}
	}
	if c.FS == nil {
		c.FS = fsx.NewOS(c.Log)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Log = c.Log.With().Str("component", "checkpoint_import").Logger()
	r.c.Store(&c)
}

// marker is the import's record in the checkpoint's dir.
type marker struct {
	Op   string `json:"op"`
	Head Head   `json:"head"`
}

// fail is an import's failure for good: the reason (fsm.ImportNotFound,
// ...) leads its text, so the claim waiting on it answers accordingly.
func fail(reason string, err error) error {
	return executors.Unrecoverablef("%s: %w", reason, err)
}

// ImportCheckpoint implements executors.CheckpointImporter: fetch, verify,
// publish; see the package doc for the order and the crash argument.
func (r *Receiver) ImportCheckpoint(ctx context.Context, in fsm.FetchCheckpoint) (executors.Result, error) {
	c := r.c.Load()
	if c == nil {
		return executors.Result{}, fail(fsm.ImportRefused, errors.New("this node has no checkpoint transport configured"))
	}
	rel := layout.CheckpointRel(in.Checkpoint)
	final, err := c.Roots.SnapshotIn(layout.CheckpointStore, rel)
	if err != nil {
		return executors.Result{}, err
	}
	run := &importRun{c: c, ctx: ctx, op: in.OpID}
	var done *marker
	if err := run.step(StepCheck, func() error {
		done, err = c.existing(final, in.OpID)
		return err
	}); err != nil {
		return executors.Result{}, err
	}
	if done == nil {
		m, err := run.fetchInto(in, final)
		if err != nil {
			return executors.Result{}, err
		}
		done = m
	}
	if err := run.step(StepSyncTree, func() error { return c.FS.SyncTree(final) }); err != nil {
		// Nothing references the copy yet, and the checkpoint store is not
		// swept: it goes now, and the import fails (the next claim asks
		// again) rather than leave a dir no record owns.
		if derr := fsx.Discard(c.FS, c.Roots.Store, final, "import-"+in.OpID.String()); derr != nil {
			c.Log.Warn().Err(derr).Str("dir", final).Msg("import: could not remove an import that failed after its rename")
		}
		return executors.Result{}, fail(fsm.ImportRefused, err)
	}
	h := done.Head
	return executors.Result{Report: run.rep, SnapshotDir: rel, Checkpoint: &fsm.CheckpointMeta{
		Key: h.Key, Name: h.Name, Tenant: h.Tenant, Claim: h.SandboxID, Created: h.CreatedNS, Expires: h.ExpiresNS}}, nil
}

// existing reads what stands under final: the op's own import (a re-run
// after the rename), nothing, or the leftover of an earlier import of the
// id that failed after its rename (removed: the state holds no other
// record of the id while it is imported). Anything else is not the
// import's to touch.
func (c *Config) existing(final string, op event.OpID) (*marker, error) {
	b, err := os.ReadFile(filepath.Join(final, MarkerName))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Lstat(final); errors.Is(serr, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fail(fsm.ImportRefused, fmt.Errorf("%s holds a checkpoint this node did not import; not touching it", final))
	}
	if err != nil {
		return nil, err
	}
	var m marker
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fail(fsm.ImportRefused, fmt.Errorf("%s: unreadable import marker: %w", final, err))
	}
	if m.Op == op.String() {
		return &m, nil
	}
	return nil, fsx.Discard(c.FS, c.Roots.Store, final, "import-"+op.String())
}

type importRun struct {
	c   *Config
	ctx context.Context
	op  event.OpID
	rep event.ExecReport
}

func (r *importRun) step(name string, fn func() error) error {
	if h := r.c.Hook; h != nil {
		if err := h(r.ctx, name, r.op); err != nil {
			return fmt.Errorf("checkpoint_import %s: %w", name, err)
		}
	}
	t0 := r.c.Now()
	err := fn()
	r.rep.Steps = append(r.rep.Steps, event.Step{Name: name, NS: int64(r.c.Now().Sub(t0))})
	if err != nil {
		return fmt.Errorf("checkpoint_import %s: %w", name, err)
	}
	return nil
}

// fetchInto stages the blob in a temp dir and renames it to final; on any
// failure the temp dir goes.
func (r *importRun) fetchInto(in fsm.FetchCheckpoint, final string) (m *marker, err error) {
	c := r.c
	var tmp string
	defer func() {
		if err != nil && tmp != "" {
			if rerr := c.FS.RemoveAll(tmp); rerr != nil {
				c.Log.Warn().Err(rerr).Str("tmp", tmp).Msg("import: temp dir left for the start-up sweep")
			}
		}
	}()
	if err := r.step(StepMkTemp, func() error {
		// The checkpoint dir too: a driver without checkpoints of its own
		// may not have made it.
		if err := c.FS.MkdirAll(filepath.Dir(final), 0o755); err != nil {
			return err
		}
		tmp, err = c.FS.MkTempDir(c.Roots.Store, string(fsm.KindCheckpointImport))
		return err
	}); err != nil {
		return nil, err
	}
	var head Head
	if err := r.step(StepFetch, func() error {
		head, err = c.fetch(r.ctx, in, tmp)
		return err
	}); err != nil {
		return nil, err
	}
	m = &marker{Op: in.OpID.String(), Head: head}
	if err := r.step(StepMarker, func() error {
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		return c.FS.WriteFileAtomic(filepath.Join(tmp, MarkerName), b, 0o644)
	}); err != nil {
		return nil, err
	}
	if err := r.step(StepSyncFiles, func() error { return c.FS.SyncTree(tmp) }); err != nil {
		return nil, err
	}
	if err := r.step(StepRename, func() error { return c.FS.RenameDir(tmp, final) }); err != nil {
		return nil, err
	}
	tmp = ""
	return m, nil
}

// fetch GETs the blob of in's checkpoint from its origin into dir.
func (c *Config) fetch(ctx context.Context, in fsm.FetchCheckpoint, dir string) (Head, error) {
	u := "http://" + in.Origin + "/v1/checkpoints/" + url.PathEscape(in.Checkpoint) + "/blob"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Head{}, fail(fsm.ImportUnreachable, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return Head{}, err // shutdown: the import resumes on the next start
		}
		return Head{}, fail(fsm.ImportUnreachable, fmt.Errorf("origin %s: %w", in.Origin, err))
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return Head{}, fail(fsm.ImportNotFound, fmt.Errorf("origin %s holds no checkpoint %s", in.Origin, in.Checkpoint))
	default:
		return Head{}, fail(fsm.ImportUnreachable, fmt.Errorf("origin %s answered %s: %s", in.Origin, resp.Status, errorText(resp.Body)))
	}
	head, err := Receive(resp.Body, dir, in.Checkpoint, c.Format, c.MaxBytes)
	switch {
	case err == nil:
		return head, nil
	case ctx.Err() != nil:
		return head, err
	case errors.Is(err, ErrRefused):
		return head, fail(fsm.ImportRefused, fmt.Errorf("from %s: %w", in.Origin, err))
	case errors.Is(err, ErrStream):
		return head, fail(fsm.ImportUnreachable, fmt.Errorf("from %s: %w", in.Origin, err))
	}
	// The local store's (a full disk): retried, then failed.
	return head, err
}

// errorText is an error answer's {"error": ...}, bounded.
func errorText(r io.Reader) string {
	var body struct {
		Error string `json:"error"`
	}
	if json.NewDecoder(io.LimitReader(r, 4<<10)).Decode(&body) != nil || body.Error == "" {
		return "(no error text)"
	}
	return body.Error
}
