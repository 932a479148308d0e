// Command sbx-agent is the guest side of the agent protocol (package executors/guest/agent).
// The initramfs's init starts it on the agent serial port; it is built static
// (CGO_ENABLED=0) because the initramfs has no libc.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/executors/guest/agent"
)

func main() {
	tty := flag.String("tty", "/dev/ttyS1", "serial device the host talks to")
	data := flag.String("data", "/tmp/sbx-data", "data file for write and sha (on tmpfs)")
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
	}
	go func() {
		for range time.Tick(agent.Tick) {
			srv.Count()
		}
	}()
	for {
		if err := serve(srv, *tty); err != nil {
			fmt.Fprintf(os.Stderr, "sbx-agent: %v\n", err)
		}
		time.Sleep(time.Second)
	}
}

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
