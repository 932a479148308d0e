package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// VMMStats is the resource usage of one VM's VMM process, as the node's
// hypervisor driver reads it (the API reads no run dir or /proc itself).
type VMMStats struct {
	Pid int
	// RSSBytes is the process's resident set.
	RSSBytes int64
	// CPUSeconds is the user plus system CPU time the process used.
	CPUSeconds float64
}

// StatsFunc returns the usage of the VMM serving vm; ErrNoVMM when none
// runs (a VM between processes, or one the driver cannot find).
type StatsFunc func(ctx context.Context, vm string) (VMMStats, error)

// ErrNoVMM is StatsFunc's answer for a VM no VMM process serves.
var ErrNoVMM = errors.New("no VMM process serves the VM")

// SandboxStats is GET /v1/sandboxes/{id}/stats's answer: the old daemon's
// fields, every one always present, then sbxlog's.
type SandboxStats struct {
	ID string `json:"id"`
	// CPUCount and MemTotalBytes come from the size the VM was made with.
	CPUCount      int   `json:"cpu_count"`
	MemTotalBytes int64 `json:"mem_total_bytes"`
	// MemUsedBytes is the VMM process's resident set; MemUsedMeasured is
	// false (and MemUsedBytes 0) when there is no process to measure: a
	// hibernated sandbox, or a VMM the driver did not find. A zero is then
	// never read as idle.
	MemUsedBytes    int64  `json:"mem_used_bytes"`
	MemUsedMeasured bool   `json:"mem_used_measured"`
	Hibernated      bool   `json:"hibernated"`
	MeasuredAt      string `json:"measured_at"`
	// CPUSeconds is the CPU time (user + system) the VMM process used since
	// it started: a wake starts a new process. 0 when not measured.
	CPUSeconds float64 `json:"cpu_seconds"`
	State      string  `json:"state"`
	VM         string  `json:"vm,omitempty"`
}

// handleStats answers GET /v1/sandboxes/{id}/stats for a live claim.
// Reading never wakes, touches or changes the sandbox.
func (s *Server) handleStats(w http.ResponseWriter, r *http.Request, id auth.Identity) error {
	c, err := s.liveTarget(r, id)
	if err != nil {
		return err
	}
	size, _ := fsm.SizeNamed(c.Key.Size)
	out := SandboxStats{
		ID: c.ID, CPUCount: size.VCPUs, MemTotalBytes: int64(size.MemoryMiB) << 20,
		Hibernated: c.Status == fsm.ClaimHibernated, State: c.Status.String(), VM: c.VM,
	}
	if !out.Hibernated && c.VM != "" && s.stats != nil {
		u, err := s.stats(r.Context(), c.VM)
		switch {
		case err == nil:
			out.MemUsedBytes, out.MemUsedMeasured, out.CPUSeconds = u.RSSBytes, true, u.CPUSeconds
		case errors.Is(err, ErrNoVMM):
		default:
			// Unmeasured, as the old daemon answered: stats are advisory.
			s.zl.Warn().Err(err).Str("sandbox", c.ID).Str("vm", c.VM).Msg("api: VMM stats unavailable")
		}
	}
	out.MeasuredAt = s.now().UTC().Format(time.RFC3339Nano)
	writeJSON(w, http.StatusOK, out)
	return nil
}
