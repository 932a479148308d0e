package executors

import (
	"context"
	"errors"
	"net"
)

// AgentDialer is implemented by drivers whose VMs run a guest agent the host
// can reach: the data plane (exec, files, guest ports) speaks the silkd v1
// protocol of package executors/guest/silkd over what DialAgent returns.
//
// DialAgent connects to the agent of the VM whose run dir is runDir (relative
// to the runs root and led by the instance id, as fsm.VMRec.RunDir and the
// intents carry it). Contract:
//   - The returned connection has done the transport's own handshake and
//     carries silkd frames from its first byte: nothing the agent sent has
//     been read from it. It is the transport's own connection type where
//     possible (*net.UnixConn, *net.TCPConn), so a relay keeps the kernel's
//     splice path.
//   - ctx bounds the dial and the handshake only; the connection has no
//     deadline, and closing it is the caller's.
//   - Every failure wraps ErrAgentUnreachable (and the cause): no such VM
//     or run dir, the VMM gone, the guest not accepting. A run dir of
//     another instance is also *Unrecoverable. A context that ended is
//     reported with the context's error as well.
//   - It never wakes, starts or otherwise changes the VM: a hibernated VM
//     has no agent to reach, and waking it is the caller's decision.
//   - Calls may run concurrently, for one VM and for many.
type AgentDialer interface {
	DialAgent(ctx context.Context, runDir string) (net.Conn, error)
}

// ErrAgentUnreachable is wrapped by every DialAgent failure.
var ErrAgentUnreachable = errors.New("executors: guest agent unreachable")
