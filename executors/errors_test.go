package executors

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestErrorClasses(t *testing.T) {
	cases := []struct {
		err                error
		unrec, lost, capac bool
	}{
		{errors.New("x"), false, false, false},
		{fmt.Errorf("a: %w", Unrecoverablef("b")), true, false, false},
		{Lostf("vmm died"), true, true, false},
		{fmt.Errorf("clone: %w", syscall.ENOSPC), false, false, true},
		{Capacity(errors.New("exchange full")), false, false, true},
		{errors.New(`ch vm.snapshot: 500: Failed to write: No space left on device (os error 28)`), false, false, true},
		{AsUnrecoverable(syscall.EDQUOT), true, false, true},
	}
	for _, c := range cases {
		if IsUnrecoverable(c.err) != c.unrec || IsLost(c.err) != c.lost || IsCapacity(c.err) != c.capac {
			t.Errorf("%v: unrecoverable %v lost %v capacity %v", c.err, IsUnrecoverable(c.err), IsLost(c.err), IsCapacity(c.err))
		}
	}
}
