package api

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/relay"
)

// ExecRequest is POST /v1/sandboxes/{id}/exec's body, strict as the old
// daemon's: user, stdin, detach and session are not fields.
type ExecRequest struct {
	Argv []string          `json:"argv"`
	Cwd  string            `json:"cwd,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	// TimeoutSeconds bounds the command from when the sandbox runs (a
	// wake does not count); 0 means no bound but the request's.
	TimeoutSeconds int64 `json:"timeout_seconds,omitzero"`
}

// ExecResponse is a buffered exec's answer: the output as JSON strings
// (invalid UTF-8 becomes U+FFFD).
type ExecResponse struct {
	ExitCode int32  `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// Buffered exec bounds.
const (
	// ExecOutputCap bounds one command's stdout and stderr together: over
	// it the command is killed and the answer is 413.
	ExecOutputCap = 8 << 20
	// ExecNodeOutputCap bounds the output all buffered execs of the node
	// hold at once: over it the command is killed and the answer is 503.
	ExecNodeOutputCap = 64 << 20
	// execKillWait bounds the kill of an abandoned command.
	execKillWait = 5 * time.Second
)

var (
	errOutputCap  = errors.New("command output exceeds the buffered exec cap")
	errNodeOutput = errors.New("buffered exec output memory of the node is exhausted")
)

// handleExec is POST /v1/sandboxes/{id}/exec: run one command in the guest
// and answer its exit code and output, buffered. The sandbox is woken
// first; the timeout starts once it runs. A command abandoned (timeout,
// output cap, client gone, guest connection lost) is killed over a fresh
// connection, so nothing keeps running behind the answer.
//
// dispatch has authenticated the caller before reading the body: only the
// sandbox's own token gets this far.
func (s *Server) handleExec(w http.ResponseWriter, r *http.Request, _ auth.Identity) error {
	var req ExecRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	switch {
	case len(req.Argv) == 0:
		return errorf(http.StatusBadRequest, "argv must not be empty")
	case req.TimeoutSeconds < 0:
		return errorf(http.StatusBadRequest, "timeout_seconds must not be negative")
	}
	o, err := s.data.open(r, r.PathValue("id"), fsm.RelayExec, 0, false, s.data.dialGuest)
	if err != nil {
		var ge *guestError
		if errors.As(err, &ge) {
			return errorf(http.StatusBadGateway, "%s", errGuestUnreachable)
		}
		return err
	}
	ctx, cancel := r.Context(), context.CancelFunc(func() {})
	if req.TimeoutSeconds > 0 {
		ctx, cancel = context.WithTimeout(ctx, execTimeout(req.TimeoutSeconds))
	}
	defer cancel()
	// A release, a reap or a shutdown ends the command's connection.
	if reason := o.live.attach(func(string) { o.guest.Close() }); reason != "" {
		o.guest.Close()
	}
	out := (&execOutput{node: &s.data.execBytes}).init()
	defer out.release()
	var pid uint32
	res, err := silkd.NewConn(o.guest).Exec(ctx, silkd.Exec{Argv: req.Argv, Cwd: req.Cwd, Env: req.Env},
		silkd.ExecIO{Stdout: &out.stdout, Stderr: &out.stderr, Started: func(p uint32) { pid = p }})
	o.guest.Close()
	reason := relay.ReasonGuest
	if err != nil {
		reason = "error"
	}
	s.data.close(o, relay.Result{Reason: reason, Out: out.total})
	if err != nil && pid != 0 {
		go s.data.killExec(o.vm, pid)
	}
	var fe *silkd.Error
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, ExecResponse{ExitCode: res.Code, Stdout: out.stdout.String(), Stderr: out.stderr.String()})
		return nil
	case r.Context().Err() != nil:
		// The client is gone: no answer at all, as the old daemon.
		panic(http.ErrAbortHandler)
	case errors.Is(err, context.DeadlineExceeded):
		return errorf(http.StatusGatewayTimeout, "command timed out")
	case errors.Is(err, errOutputCap):
		return errorf(http.StatusRequestEntityTooLarge, "%v", errOutputCap)
	case errors.Is(err, errNodeOutput):
		return &httpError{status: http.StatusServiceUnavailable, msg: errNodeOutput.Error(), retryAfter: "1"}
	case errors.As(err, &fe) && fe.Kind == silkd.KindBadRequest:
		return errorf(http.StatusBadRequest, "%s", fe.Message)
	case errors.As(err, &fe):
		return errorf(http.StatusBadGateway, "%s: %s", fe.Kind, fe.Message)
	}
	return errorf(http.StatusBadGateway, "guest agent closed before the command exited")
}

// execTimeout turns timeout_seconds into a duration; a value too large for
// one is no bound at all rather than one already expired.
func execTimeout(secs int64) time.Duration {
	if secs > int64(math.MaxInt64/time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(secs) * time.Second
}

// killExec kills an abandoned command over a fresh connection (SIGKILL);
// a pid the agent no longer knows has ended anyway.
func (d *dataPlane) killExec(vm guestVM, pid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), execKillWait)
	defer cancel()
	nc, err := d.dialGuest(ctx, vm)
	if err == nil {
		defer nc.Close()
		err = silkd.NewConn(nc).Kill(ctx, pid, nil)
	}
	if err != nil && !errors.Is(err, silkd.ErrNotFound) {
		d.s.zl.Warn().Err(err).Str("vm", vm.ID).Uint32("pid", pid).Msg("api: could not kill an abandoned exec")
	}
}

// execOutput collects a command's output within the per-command cap and
// the node's, which it reserves as it grows.
type execOutput struct {
	node           *atomic.Int64
	stdout, stderr capped
	total          int64
}

// capped is one stream of an execOutput.
type capped struct {
	bytes.Buffer
	o *execOutput
}

func (c *capped) Write(p []byte) (int, error) {
	o := c.o
	if o.total+int64(len(p)) > ExecOutputCap {
		return 0, errOutputCap
	}
	if o.node.Add(int64(len(p))) > ExecNodeOutputCap {
		o.node.Add(-int64(len(p)))
		return 0, errNodeOutput
	}
	o.total += int64(len(p))
	return c.Buffer.Write(p)
}

// release gives the output's reservation back to the node.
func (o *execOutput) release() { o.node.Add(-o.total) }

func (o *execOutput) init() *execOutput {
	o.stdout.o, o.stderr.o = o, o
	return o
}
