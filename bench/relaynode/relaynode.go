// Package relaynode is the benchmarks' sandboxd for the data plane: one
// in-process node (nodetest: the real api.Server, engine and Pebble op log
// on the scratch disk behind a real net/http server on loopback, the
// hypervisor FAKED) with one claimed sandbox, whose guest agent is whatever
// listens on a unix socket the caller names. The node's dialer reaches that
// socket the way it reaches a hybrid-vsock socket (a raw *net.UnixConn, so
// the relay splices), and the caller may point it at another socket between
// measurements, so two guests (an echo, a real agent) go through the same
// relay of the same node.
//
// Echo is the guest that sends back what it gets, Throughput the bytes
// it echoes per second over a dialed connection (the relay's raw rate),
// and Copier the relay without sandboxd: the same hop by a plain io.Copy
// each way. relaybench and tarbench both start their node and echo here.
package relaynode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/cmd/sandboxd/node/nodetest"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

const rootToken = "bench-root-token"

var key = fsm.PoolKey{Template: "default", Net: "none", Size: "small"}

// Node is the running node and its one claimed sandbox.
type Node struct {
	n      *nodetest.Node
	guest  *guestDialer
	id     string
	client *apiclient.Client // holds the sandbox's own token
	token  string
}

// Start starts a node under dir whose guest agent is the unix socket at
// guest, waits for its warm VM and claims it.
func Start(ctx context.Context, dir, guest string) (*Node, error) {
	gd := &guestDialer{}
	gd.path.Store(&guest)
	n, err := nodetest.Start(nodetest.Options{
		Dir: dir, RootToken: rootToken, Log: zerolog.Nop(),
		Pools: []fsm.PoolSpec{{PoolKey: key, Warm: 1}},
		Tune:  func(c *node.Config) { c.DataPlane.Dialer = gd },
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = n.WaitWarm(wctx, key, 1)
	cancel()
	if err != nil {
		n.Close()
		return nil, err
	}
	root, err := apiclient.New(n.URL, rootToken, nil)
	if err != nil {
		n.Close()
		return nil, err
	}
	claim, err := root.Claim(ctx, api.ClaimRequest{Template: key.Template})
	if err != nil {
		n.Close()
		return nil, err
	}
	return &Node{n: n, guest: gd, id: claim.ID, client: root.WithToken(claim.Token), token: claim.Token}, nil
}

// SetGuest points the sandbox's guest agent at the unix socket at path
// for the relays opened from now on.
func (n *Node) SetGuest(path string) { n.guest.path.Store(&path) }

// DialUpgrade opens the sandbox's agent relay as the old SDK does (its
// exact upgrade request, the sandbox token) and returns the connection
// after the 101.
func (n *Node) DialUpgrade(ctx context.Context) (net.Conn, error) {
	addr := n.n.Addr()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	req := "GET /v1/sandboxes/" + n.id + "/agent HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: silkd\r\nAuthorization: Bearer " + n.token + "\r\n\r\n"
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

const switching101 = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: silkd\r\nConnection: Upgrade\r\n\r\n"

// DialAgent opens the sandbox's agent relay with the project's client
// (apiclient.Client.DialAgent, the sandbox's own token).
func (n *Node) DialAgent(ctx context.Context) (net.Conn, error) {
	return n.client.DialAgent(ctx, n.id)
}

// Close stops the node.
func (n *Node) Close() { n.n.Close() }

// guestDialer is the node's guest dialer: every VM's agent is the unix
// socket last stored.
type guestDialer struct {
	path atomic.Pointer[string]
}

func (g *guestDialer) DialAgent(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", *g.path.Load())
}

// Echo is the benchmarks' relay guest: a unix listener whose connections get
// back what they send, half-closing at their input's end.
type Echo struct {
	// Path is the socket's.
	Path string
	ln   net.Listener
	wg   sync.WaitGroup
}

// StartEcho listens at path.
func StartEcho(path string) (*Echo, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	e := &Echo{Path: path, ln: ln}
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

// Close stops listening and waits for the accept loop.
func (e *Echo) Close() {
	e.ln.Close()
	e.wg.Wait()
}

// Copier is the relay without sandboxd (relaybench's floor): a TCP
// listener whose every connection is joined to a fresh connection to the
// guest's unix socket by a plain io.Copy each way (which Go runs on
// splice(2) between these two), passing a half-close on.
type Copier struct {
	ln net.Listener
	wg sync.WaitGroup
}

// StartCopier listens on loopback TCP and joins each connection to a
// fresh connection to the unix socket at guest.
func StartCopier(guest string) (*Copier, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	cp := &Copier{ln: ln}
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

// Addr is the listener's address.
func (cp *Copier) Addr() string { return cp.ln.Addr().String() }

// Close stops listening and waits for the accept loop.
func (cp *Copier) Close() {
	cp.ln.Close()
	cp.wg.Wait()
}

// Chunk is the size of Throughput's writes and reads.
const Chunk = 256 << 10

// Throughput runs streams connections at once, each sending size bytes and
// reading them back in Chunk-sized writes and reads, and returns the bytes
// echoed per second.
func Throughput(ctx context.Context, dial func(context.Context) (net.Conn, error), streams int, size int64) (float64, error) {
	conns := make([]net.Conn, streams)
	for i := range conns {
		c, err := dial(ctx)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		conns[i] = c
	}
	buf := make([]byte, Chunk)
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
			for sent := int64(0); sent < size; sent += Chunk {
				if _, err := c.Write(buf[:min(Chunk, size-sent)]); err != nil {
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

// drain reads c to its end in Chunk-sized reads and checks it got size
// bytes.
func drain(c net.Conn, size int64) error {
	buf := make([]byte, Chunk)
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
