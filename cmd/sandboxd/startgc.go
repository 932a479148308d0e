package main

import "runtime/debug"

// startGCPercent is the GC target while sandboxd starts. Rebuilding the state
// and reconciling allocate it all at once; collecting while it grows only
// re-marks what stays live, and at 100k live claims the default target
// spends a third of restart-to-serving in the collector (bench/restartbench
// measures the same start path with it).
const startGCPercent = 400

// startGC raises the GC target for start-up, unless GOGC already asks for
// more (or turns the collector off), and returns what restores it.
func startGC() (restore func()) {
	prev := debug.SetGCPercent(startGCPercent)
	if prev < 0 || prev > startGCPercent {
		debug.SetGCPercent(prev)
	}
	return func() { debug.SetGCPercent(prev) }
}
