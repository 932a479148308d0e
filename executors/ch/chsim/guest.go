package chsim

import (
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
)

// The simulated guest's silkd agent, on vsock port silkd.Port. It is the
// project's protocol engine (package silkagent) over silkagent's simulated
// guest, so the protocol is the real one and only what it acts on is
// simulated:
//   - info says so: agent SimAgent, simulated true.
//   - Files live in memory, one tree per VM (its tmpfs): empty after a
//     boot but for /tmp and /root, kept in the snapshot's state.json across
//     hibernate and wake, bounded by Options.GuestFSBytes and half the VM's
//     memory (what would pass it fails with ENOSPC, reported as a full
//     tmpfs is).
//   - exec runs no host command, ever: silkagent.SimSpawner simulates
//     silkagent.SimCommands over the VM's tree; anything else is a
//     bad_request that says "chsim simulates the guest and runs no
//     commands".
//   - ps, logs, attach and kill act on the simulated processes as on real
//     ones; sessions are silkagent's simulated shell over the VM's tree
//     (cd, export, eval of simple shell text), kept in the snapshot's
//     state.json across hibernate and wake as a real guest's are in its
//     memory (a command running at the snapshot is lost, as its connection
//     is); pty_open is unimplemented and says the guest is simulated.
//   - port_forward reaches silkagent.SimDial's in-memory echo server on
//     silkagent.SimEchoPort (both half-closes work) or its HTTP server on
//     silkagent.SimHTTPPort; every other port is refused (not_found).
//   - Connections opened before a pause keep being answered while the VM is
//     paused (a real guest would stall them); new ones wait for the VM to
//     run, as the CONNECT handshake does.

// SimAgent is the simulated agent's name in info.
const SimAgent = "chsim simulated guest"

// simGuest is the guest side of one boot of a VM: its files, its silkd
// agent and its control agent (clock.go).
type simGuest struct {
	files *silkagent.MemFS
	agent *silkagent.Server
	line  *agent.Server
}

// newSimGuest makes v's guest with files (a restored guest's, or none).
func (s *Server) newSimGuest(v *vmInstance, files []silkagent.MemFile) *simGuest {
	fs := silkagent.NewMemFS(files)
	fs.Now = s.now
	fs.Limit = s.guestFSLimit(v)
	// A guest starts with the directories a busybox initramfs has.
	for _, d := range []string{"/tmp", "/root"} {
		if _, err := fs.Stat(d); err != nil {
			_ = fs.Mkdir(d, true)
		}
	}
	return &simGuest{
		files: fs,
		agent: &silkagent.Server{
			Version:   "chsim",
			Agent:     SimAgent,
			Simulated: true,
			FS:        fs,
			Procs:     &silkagent.SimSpawner{Name: "chsim", FS: fs},
			Dial:      silkagent.SimDial,
		},
		line: s.newLineAgent(v),
	}
}

// guestFSLimit is the bound of v's simulated tmpfs: GuestFSBytes (its
// default when unset), and at most half the VM's memory.
func (s *Server) guestFSLimit(v *vmInstance) int64 {
	limit := s.opts.GuestFSBytes
	if limit == 0 {
		limit = DefaultGuestFSBytes
	}
	if half := v.memSize / 2; half > 0 {
		limit = min(limit, half)
	}
	return limit
}
