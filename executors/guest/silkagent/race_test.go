//go:build race

package silkagent

// raceEnabled: the race detector slows the whole-tree ops tenfold, so the
// round trip uses a smaller tree under it.
const raceEnabled = true
