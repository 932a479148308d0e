package netnstest

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// OpenTap attaches to tap name in ns (making it when it does not exist,
// as a tap that lives while the file is open) and returns its file: what a
// VMM holds. Frames written to it are what the guest sends (the tap's
// ingress); frames read from it are what the host sends the guest. Plain
// Ethernet frames: no packet-information or virtio-net header.
func OpenTap(t TB, ns *NS, name string) *os.File {
	t.Helper()
	var f *os.File
	ns.MustDo(t, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("TUNSETIFF %s: %w", name, err)
		}
		// Non-blocking, so the runtime polls it and Close ends a Read.
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), name)
		return nil
	})
	t.Cleanup(func() { f.Close() })
	return f
}

// Relay copies frames both ways between two taps' files until either is
// closed (at cleanup): a guest namespace's tap stands in for the guest NIC
// of a VM whose host tap is b, as the VMM would carry its frames.
func Relay(t TB, a, b *os.File) {
	t.Helper()
	var wg sync.WaitGroup
	pump := func(dst, src *os.File) {
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			n, err := src.Read(buf)
			if err != nil {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(a, b)
	go pump(b, a)
	t.Cleanup(func() { a.Close(); b.Close(); wg.Wait() })
}

// AttachGuest is a guest namespace standing for the guest of a VM whose
// tap (made, locked and put on the bridge by the node) is tap in the lane's
// host namespace: its NIC's frames are carried to and from that tap, as the
// VMM would, and it has the MAC and address the host pinned the VM to
// (the lock's), routed via the bridge. A VMM that holds the tap itself (a
// real QEMU) cannot share it: this is for VMs whose VMM does not (chsim).
// The namespace and the relay end at t's cleanup; the tap stays.
func (l *Lane) AttachGuest(t TB, name, tap string, mac net.HardwareAddr, addr netip.Addr) *Guest {
	t.Helper()
	g := &Guest{NS: New(t, name), Tap: tap, MAC: mac, Addr: addr}
	gtap := OpenTap(t, g.NS, "eth0")
	g.SetMAC(t, "eth0", mac)
	g.AddrAdd(t, "eth0", netip.PrefixFrom(addr, l.Subnet.Bits()))
	g.RouteDefault(t, l.HostAddr)
	Relay(t, gtap, OpenTap(t, l.Host, tap))
	return g
}
