package main

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/executors/chdriver"
)

// envCrashAt is a TEST SEAM for the restart-safety tests (bench/chaos and
// the targeted crash tests): "<recipe>:<step>" makes sandboxd die the first
// time a recipe reaches that step, by SIGKILL to itself (what kill -9 does
// to it); "<recipe>:<step>:panic" dies of an unrecovered panic instead.
// Recipe and step names are the drivers': chdriver's (Recipe*, Step*;
// rollback actions are "undo_<step>"; the checkpoint import's,
// "checkpoint_import", transport.Step*), the archive executor's (archive,
// unarchive; archive.Step*), both before the step runs, and QEMU's snapshot
// recipes (checkpoint, promote, hibernate, golden; qemu.Step*), right after
// the step ran (QEMU times its steps at their end). Never set it in
// production.
const envCrashAt = "SBX_CRASH_AT"

// crashSeam is SBX_CRASH_AT armed: at reports whether (recipe, step) is
// the armed one, the first time only, and then never returns.
type crashSeam struct {
	zl           zerolog.Logger
	spec         string
	recipe, step string
	panics       bool
	fired        atomic.Bool
}

// armCrash returns the armed seam of SBX_CRASH_AT, or nil.
func armCrash(zl zerolog.Logger) *crashSeam {
	spec := strings.TrimSpace(os.Getenv(envCrashAt))
	if spec == "" {
		return nil
	}
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" || (len(parts) == 3 && parts[2] != "panic" && parts[2] != "kill") {
		zl.Error().Str(envCrashAt, spec).Msg("ignored: want <recipe>:<step>[:panic|kill]")
		return nil
	}
	zl.Warn().Str(envCrashAt, spec).Msg("test seam armed: sandboxd will crash at this recipe step")
	return &crashSeam{zl: zl, spec: spec, recipe: parts[0], step: parts[1], panics: len(parts) == 3 && parts[2] == "panic"}
}

// at crashes sandboxd if (recipe, step) is the armed step, the first time.
func (c *crashSeam) at(recipe, step, op string) {
	if c == nil || recipe != c.recipe || step != c.step || !c.fired.CompareAndSwap(false, true) {
		return
	}
	c.zl.Warn().Str("recipe", recipe).Str("step", step).Str("op", op).Msg("SBX_CRASH_AT: crashing now")
	if c.panics {
		// A goroutine's panic is not recovered by the scheduler: it
		// ends the process like a bug would.
		go func() { panic("SBX_CRASH_AT " + c.spec) }()
		select {}
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; wait for it to land
}

// crashHook returns the chdriver StepHook for SBX_CRASH_AT, or nil.
func crashHook(zl zerolog.Logger) func(context.Context, chdriver.StepCall) error {
	c := armCrash(zl)
	if c == nil {
		return nil
	}
	return func(_ context.Context, s chdriver.StepCall) error {
		c.at(s.Recipe, s.Step, s.Op.String())
		return nil
	}
}

// qemuCrashHooks returns the QEMU driver's step hook and its archive
// executor's hook for SBX_CRASH_AT, or nils.
func qemuCrashHooks(zl zerolog.Logger) (func(recipe, step string), func(context.Context, string, string, event.OpID) error) {
	c := armCrash(zl)
	if c == nil {
		return nil, nil
	}
	return func(recipe, step string) { c.at(recipe, step, "") },
		func(_ context.Context, recipe, step string, op event.OpID) error {
			c.at(recipe, step, op.String())
			return nil
		}
}
