package relaybench

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

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

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func gibps(bps float64) string { return fmt.Sprintf("%.2f GiB/s", bps/(1<<30)) }
