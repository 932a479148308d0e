package fsm

import (
	"errors"
	"testing"
)

// The size table drives validation: every row's name is a valid size, the
// rejection names them all, and each row gives a VM resources.
func TestSizeTable(t *testing.T) {
	for _, z := range Sizes {
		if err := ValidKey(PoolKey{Template: "t", Net: "none", Size: z.Name}); err != nil {
			t.Errorf("size %s: %v", z.Name, err)
		}
		if got, ok := SizeNamed(z.Name); !ok || got != z {
			t.Errorf("SizeNamed(%s) = %+v, %v", z.Name, got, ok)
		}
		if z.VCPUs < 1 || z.MemoryMiB < 16 {
			t.Errorf("size %+v gives a VM nothing", z)
		}
	}
	if _, ok := SizeNamed("huge"); ok {
		t.Error("SizeNamed(huge) found a row")
	}
	err := ValidKey(PoolKey{Template: "t", Net: "none", Size: "huge"})
	const want = `invalid size "huge": want small, medium, large, xlarge or 2xlarge`
	var r *Rejection
	if !errors.As(err, &r) || r.Code != Invalid || r.Msg != want {
		t.Fatalf("ValidKey(huge) = %#v, want Invalid %q", err, want)
	}
}

// Under TCG a VM gets half its row's vCPUs (at least one) and memory, the
// memory at most the cap when one is set.
func TestUnderTCG(t *testing.T) {
	for _, tc := range []struct {
		size          string
		capMiB        int
		vcpus, memMiB int
		capped        bool
	}{
		{"small", 0, 1, 256, false},
		{"medium", 1024, 1, 512, false},
		{"large", 1024, 2, 1024, true},
		{"2xlarge", 1024, 4, 1024, true},
		{"2xlarge", -1, 4, 8192, false},
	} {
		z, _ := SizeNamed(tc.size)
		got, capped := z.UnderTCG(tc.capMiB)
		if got != (Size{Name: tc.size, VCPUs: tc.vcpus, MemoryMiB: tc.memMiB}) || capped != tc.capped {
			t.Errorf("%s.UnderTCG(%d) = %+v, %v; want %d vCPUs %d MiB, capped %v", tc.size, tc.capMiB, got, capped, tc.vcpus, tc.memMiB, tc.capped)
		}
	}
}
