package api

import (
	"testing"

	"github.com/sbxlog/sbxlog/fsm"
)

// The VM view's live is whether a VMM runs: not for a hibernated VM, nor
// while its snapshot is archived or moving to or from the archive.
func TestVMViewLive(t *testing.T) {
	for _, tc := range []struct {
		st   fsm.VMStatus
		live bool
	}{
		{fsm.VMCloning, true}, {fsm.VMWarm, true}, {fsm.VMClaimed, true}, {fsm.VMHibernating, true},
		{fsm.VMWaking, true}, {fsm.VMDestroying, true}, {fsm.VMRestarting, true},
		{fsm.VMHibernated, false}, {fsm.VMGone, false}, {fsm.VMFailed, false},
		{fsm.VMArchiving, false}, {fsm.VMArchived, false}, {fsm.VMUnarchiving, false},
	} {
		if got := vmOf(&fsm.VMRec{ID: "vm-1", Status: tc.st}); got.Live != tc.live || got.State != tc.st.String() {
			t.Errorf("%s: view %+v, want live %v", tc.st, got, tc.live)
		}
	}
}
