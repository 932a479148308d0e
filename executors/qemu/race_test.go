//go:build race

package qemu

// raceEnabled: the test binary runs with -race, so the sandboxd the end-to-end
// test builds gets it too.
const raceEnabled = true
