// Package e2e holds end-to-end tests of the built binaries: sandboxd (with
// chsim standing in for Cloud Hypervisor) run as a process on a temp data
// dir and a free loopback port, driven over HTTP with projections/apiclient
// and with sbxctl. TestMain builds sandboxd, chsim and sbxctl once per test
// binary with `go build` into a temp dir.
//
// chsim processes outlive sandboxd by design (a restart adopts its VMs), so
// every test kills the ones whose command line names its temp data dir when
// it ends.
package e2e
