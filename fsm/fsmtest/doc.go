// Package fsmtest holds test support that drives the state machine into a
// real op log: Record feeds a generated workload (fsm/fsmsim) through
// Decide, Append and Apply as a proposer would, and Node is a node's log and
// state driven through Decide with a perfect executor. It is imported only
// by tests and benchmarks; production packages never depend on it.
package fsmtest
