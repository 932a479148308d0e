//go:build !race

package qemudriver

const raceEnabled = false
