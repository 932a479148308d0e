package chdriver

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/hvsock"
)

var _ executors.AgentDialer = (*Driver)(nil)

// DialAgent implements executors.AgentDialer over hybrid vsock: it connects
// to the VM's vsock.sock, writes "CONNECT <SilkdPort>\n" and reads the VMM's
// "OK <n>\n" byte by byte (package hvsock), so the connection it returns is
// the raw unix socket positioned at the agent's first byte. Under chsim the
// agent on that port is chsim's simulated one.
func (d *Driver) DialAgent(ctx context.Context, rel string) (net.Conn, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, rel)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", executors.ErrAgentUnreachable, err)
	}
	c, err := hvsock.Dial(ctx, filepath.Join(runDir, VsockFile), d.silkd)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", executors.ErrAgentUnreachable, rel, err)
	}
	return c, nil
}
