package relaybench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// echo is the benchmark's guest: a unix listener whose connections get
// back what they send, half-closing at their input's end.
type echo struct {
	path string
	ln   net.Listener
	wg   sync.WaitGroup
}

func startEcho(path string) (*echo, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	e := &echo{path: path, ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.UnixConn).CloseWrite()
			}()
		}
	}()
	return e, nil
}

func (e *echo) Close() {
	e.ln.Close()
	e.wg.Wait()
}

// copier is the floor: a TCP listener whose every connection is joined to
// a fresh connection to the guest's unix socket by a plain io.Copy each
// way (which Go runs on splice(2) between these two), passing a half-close
// on; what a relay is with no sandboxd around it.
type copier struct {
	ln net.Listener
	wg sync.WaitGroup
}

func startCopier(guest string) (*copier, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	cp := &copier{ln: ln}
	cp.wg.Add(1)
	go func() {
		defer cp.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g, err := net.Dial("unix", guest)
			if err != nil {
				c.Close()
				continue
			}
			go join(c.(*net.TCPConn), g.(*net.UnixConn))
		}
	}()
	return cp, nil
}

// join copies both ways until both directions ended.
func join(c *net.TCPConn, g *net.UnixConn) {
	defer c.Close()
	defer g.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(g, c)
		_ = g.CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(c, g)
	_ = c.CloseWrite()
	<-done
}

func (cp *copier) addr() string { return cp.ln.Addr().String() }

func (cp *copier) Close() {
	cp.ln.Close()
	cp.wg.Wait()
}

// unixDialer is the node's guest dialer: every VM's agent is the echo.
type unixDialer string

func (u unixDialer) DialAgent(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", string(u))
}

const switching101 = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: silkd\r\nConnection: Upgrade\r\n\r\n"

// dialRelay opens the agent relay of sandbox id as the old SDK does and
// returns the connection after the 101.
func dialRelay(ctx context.Context, addr, id, token string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	req := "GET /v1/sandboxes/" + id + "/agent HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: silkd\r\nAuthorization: Bearer " + token + "\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		return nil, err
	}
	head := make([]byte, len(switching101))
	if _, err := io.ReadFull(c, head); err != nil || string(head) != switching101 {
		c.Close()
		return nil, fmt.Errorf("upgrade answered %q: %v", head, err)
	}
	return c, nil
}

// connectOnce times a fresh connection up to its first echoed byte.
func connectOnce(ctx context.Context, dial func(context.Context) (net.Conn, error)) (time.Duration, error) {
	start := time.Now()
	c, err := dial(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'x'}); err != nil {
		return 0, err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// throughput runs streams connections at once, each sending size bytes and
// reading them back, and returns the bytes echoed per second.
func throughput(ctx context.Context, dial func(context.Context) (net.Conn, error), streams int, size int64) (float64, error) {
	conns := make([]net.Conn, streams)
	for i := range conns {
		c, err := dial(ctx)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		conns[i] = c
	}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i)
	}
	errs := make(chan error, 2*streams)
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for sent := int64(0); sent < size; sent += chunk {
				if _, err := c.Write(buf[:min(chunk, size-sent)]); err != nil {
					errs <- err
					return
				}
			}
			if cw, ok := c.(interface{ CloseWrite() error }); ok {
				errs <- cw.CloseWrite()
			}
		}()
		go func() {
			defer wg.Done()
			errs <- drain(c, size)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	var all error
	for err := range errs {
		all = errors.Join(all, err)
	}
	if all != nil {
		return 0, all
	}
	return float64(size) * float64(streams) / elapsed.Seconds(), nil
}

// drain reads c to its end in chunk-sized reads and checks it got size
// bytes.
func drain(c net.Conn, size int64) error {
	buf := make([]byte, chunk)
	var got int64
	for {
		n, err := c.Read(buf)
		got += int64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	if got != size {
		return fmt.Errorf("echoed %d bytes, sent %d", got, size)
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func gibps(bps float64) string { return fmt.Sprintf("%.2f GiB/s", bps/(1<<30)) }
