package chsim_test

import (
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/executors/ch/chsim"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent/silktest"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// Issue 23's tool-ops suite (silktest) on the simulated guest, through the
// VM's vsock: the 10 MiB, 1000-file round trip and fs_watch over its tree
// (the watched file made by fs_write, as it runs no shell); git and lsp
// answered unimplemented, saying the guest is simulated.
func TestSimulatedToolOps(t *testing.T) {
	_, _, dial := simVMWith(t, chsim.DefaultOptions(), 256<<20)
	silktest.Run(t, silktest.Agent{Dial: func(testing.TB) *silkd.Conn { return dial() }, Base: "/root", Simulated: true, Timeout: 3 * time.Minute})
}
