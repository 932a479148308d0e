package main

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/executors/chdriver"
)

// envCrashAt is a TEST SEAM for the restart-safety tests (bench/chaos and
// the targeted crash tests): "<recipe>:<step>" makes sandboxd die the first
// time a CH recipe reaches that step, before the step runs, by SIGKILL to
// itself (what kill -9 does to it); "<recipe>:<step>:panic" dies of an
// unrecovered panic instead. Recipe and step names are chdriver's (Recipe*,
// Step*; rollback actions are "undo_<step>"), the checkpoint import's
// included ("checkpoint_import", transport.Step*). Never set it in
// production.
const envCrashAt = "SBX_CRASH_AT"

// crashHook returns the chdriver StepHook for SBX_CRASH_AT, or nil.
func crashHook(zl zerolog.Logger) func(context.Context, chdriver.StepCall) error {
	spec := strings.TrimSpace(os.Getenv(envCrashAt))
	if spec == "" {
		return nil
	}
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" || (len(parts) == 3 && parts[2] != "panic" && parts[2] != "kill") {
		zl.Error().Str(envCrashAt, spec).Msg("ignored: want <recipe>:<step>[:panic|kill]")
		return nil
	}
	recipe, step := parts[0], parts[1]
	panics := len(parts) == 3 && parts[2] == "panic"
	zl.Warn().Str(envCrashAt, spec).Msg("test seam armed: sandboxd will crash at this recipe step")
	var fired atomic.Bool
	return func(_ context.Context, c chdriver.StepCall) error {
		if c.Recipe != recipe || c.Step != step || !fired.CompareAndSwap(false, true) {
			return nil
		}
		zl.Warn().Str("recipe", recipe).Str("step", step).Str("op", c.Op.String()).Msg("SBX_CRASH_AT: crashing now")
		if panics {
			// A goroutine's panic is not recovered by the scheduler:
			// it ends the process like a bug would.
			go func() { panic("SBX_CRASH_AT " + spec) }()
			select {}
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; wait for it to land
	}
}
