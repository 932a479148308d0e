package relay

import (
	"net"

	"golang.org/x/sys/unix"
)

// tcpCounter returns what reads, for a TCP connection, the bytes its
// socket received plus the bytes the peer acknowledged (TCP_INFO): the
// idle watch's count of the spliced path, which no user-space copy sees.
// It returns nil for any other connection.
func tcpCounter(c net.Conn) func() (int64, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return func() (int64, bool) {
		var info *unix.TCPInfo
		var serr error
		if err := raw.Control(func(fd uintptr) {
			info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		}); err != nil || serr != nil {
			return 0, false
		}
		return int64(info.Bytes_received + info.Bytes_acked), true
	}
}

// isStream reports whether c is a stream socket (SOCK_STREAM), the unix
// sockets splice takes; it asks the kernel, so a socketpair or an inherited
// descriptor, which have no address to tell, count too.
func isStream(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	typ, serr := 0, error(nil)
	if err := raw.Control(func(fd uintptr) { typ, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE) }); err != nil || serr != nil {
		return false
	}
	return typ == unix.SOCK_STREAM
}
