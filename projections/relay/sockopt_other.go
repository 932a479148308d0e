//go:build !linux

package relay

import "net"

// tcpCounter has no kernel count off Linux: the idle watch counts the
// copying path only.
func tcpCounter(net.Conn) func() (int64, bool) { return nil }

// isStream reports whether c is a stream socket, from its address.
func isStream(c *net.UnixConn) bool {
	a, ok := c.LocalAddr().(*net.UnixAddr)
	return ok && a.Net == "unix"
}
