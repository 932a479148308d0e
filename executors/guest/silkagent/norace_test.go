//go:build !race

package silkagent

const raceEnabled = false
