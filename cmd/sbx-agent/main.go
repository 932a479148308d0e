// Command sbx-agent is the project's guest agent. The initramfs's init starts
// it; it is built static (CGO_ENABLED=0) because the initramfs has no libc.
// It serves two things:
//   - the agent protocol (package executors/guest/agent) on the agent serial
//     port (-tty): readiness, the test verbs, the data plane's key and the
//     egress network (net.go: the NIC on the VM's tap, the proxy variables
//     of every process it starts, the node CA in the trust store);
//   - the data plane, silkd v1 (package executors/guest/silkagent with the
//     machine's own processes, files and ports), on TCP (-listen), each
//     connection after the challenge-response on the key the host last
//     gave on the serial port (agent.AcceptData): each side proves it holds
//     the key, which never crosses the wire. The host reaches it through
//     QEMU's port forward (package executors/qemu).
package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
)

func main() {
	tty := flag.String("tty", "/dev/ttyS1", "serial device the host talks to")
	data := flag.String("data", "/tmp/sbx-data", "data file for write and sha (on tmpfs)")
	listen := flag.String("listen", ":2048", "TCP address of the data plane (silkd v1 after the key handshake); empty: none")
	flag.Parse()

	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		fatal(err)
	}
	srv := &agent.Server{
		DataPath: *data,
		BootID:   hex.EncodeToString(id),
		Rand:     rand.Reader,
		Uptime:   bootTime,
		Net:      applyNet,
		Mount:    mountVolume,
		Unmount:  unmountVolume,
	}
	go func() {
		for range time.Tick(agent.Tick) {
			srv.Count()
		}
	}()
	if *listen != "" {
		silk := &silkagent.Server{
			Version: "sbx-agent", Agent: "sbx-agent",
			Procs: silkagent.OSProcs{}, FS: silkagent.OSFS{}, Dial: silkagent.DialTCP,
			Git: true, LSPDir: silkagent.DefaultLSPDir,
			Uptime: func() time.Duration { d, _ := bootTime(); return d },
		}
		go serveData(srv, silk, *listen)
	}
	for {
		if err := serve(srv, *tty); err != nil {
			fmt.Fprintf(os.Stderr, "sbx-agent: %v\n", err)
		}
		time.Sleep(time.Second)
	}
}

// serveData serves the data plane on addr for good: a listen that fails
// is retried, every connection is served once it has shown the key.
func serveData(srv *agent.Server, silk *silkagent.Server, addr string) {
	for {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sbx-agent: data plane: %v\n", err)
			time.Sleep(time.Second)
			continue
		}
		fmt.Fprintf(os.Stderr, "sbx-agent: data plane on %s\n", l.Addr())
		for {
			c, err := l.Accept()
			if err != nil {
				fmt.Fprintf(os.Stderr, "sbx-agent: data plane: %v\n", err)
				l.Close()
				break
			}
			go func() {
				if err := agent.AcceptData(c, srv.DataKey(), dataHandshakeTimeout); err != nil {
					c.Close()
					return
				}
				silk.ServeConn(c)
			}()
		}
		time.Sleep(time.Second)
	}
}

// dataHandshakeTimeout bounds a data connection's handshake.
const dataHandshakeTimeout = 10 * time.Second

func serve(srv *agent.Server, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := makeRaw(int(f.Fd())); err != nil {
		return fmt.Errorf("%s: raw mode: %w", path, err)
	}
	fmt.Fprintf(os.Stderr, "sbx-agent: serving on %s (boot %s)\n", path, srv.BootID)
	return srv.Serve(f, f)
}

// makeRaw turns off echo and line editing, which would otherwise send every request
// back to the host and turn "\n" into "\r\n".
func makeRaw(fd int) error {
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return err
	}
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB | unix.CBAUD
	t.Cflag |= unix.CS8 | unix.CLOCAL | unix.CREAD | unix.B115200
	t.Cc[unix.VMIN] = 1
	t.Cc[unix.VTIME] = 0
	return unix.IoctlSetTermios(fd, unix.TCSETS, t)
}

func bootTime() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "sbx-agent: %v\n", err)
	os.Exit(1)
}
