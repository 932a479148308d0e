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
