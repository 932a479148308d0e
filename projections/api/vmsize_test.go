package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
)

// tcgSizer is a hypervisor that gives VMs less than the size table says,
// as QEMU under TCG does.
type tcgSizer struct{}

func (tcgSizer) VMSize(name string) (fsm.Size, bool) {
	z, ok := fsm.SizeNamed(name)
	if !ok {
		return z, false
	}
	t, _ := z.UnderTCG(0)
	return t, true
}

// A sandbox's cpu_count and mem_total_bytes are what its VM got on this
// node's hypervisor (Options.Sizes), in the claim listing, the sandbox's
// own record and its stats alike; without a sizer, the size table's row.
func TestSandboxSizeFromHypervisor(t *testing.T) {
	n := newNode(t, 2, nil)
	cr := claimAs(t, n, tokA, "")
	for _, c := range []struct {
		name     string
		opts     api.Options
		cpu      int
		memBytes int64
	}{
		{"size table", api.Options{}, 1, 512 << 20},
		{"QEMU under TCG", api.Options{Sizes: tcgSizer{}}, 1, 256 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := serveOver(t, n, n.Engine, c.opts).URL
			for _, path := range []string{"/v1/sandboxes/" + cr.ID, "/v1/sandboxes/" + cr.ID + "/stats"} {
				st, b := doRoot(t, base, "GET", path, "")
				var got struct {
					CPUCount      int   `json:"cpu_count"`
					MemTotalBytes int64 `json:"mem_total_bytes"`
				}
				if st != http.StatusOK || json.Unmarshal(b, &got) != nil {
					t.Fatalf("GET %s: %d %s", path, st, b)
				}
				if got.CPUCount != c.cpu || got.MemTotalBytes != c.memBytes {
					t.Errorf("GET %s: cpu_count %d, mem_total_bytes %d; want %d, %d", path, got.CPUCount, got.MemTotalBytes, c.cpu, c.memBytes)
				}
			}
		})
	}
}
