package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// The data plane's transport (see the package doc, "Agent network").
const (
	// FileAgentNet holds the VM's agent network: its host port and key
	// (run dir only, mode 0600, written before QEMU starts).
	FileAgentNet = "agent.json"
	// AgentGuestAddr is the guest's address on QEMU's user-mode network,
	// which the guest's init configures (executors/guest/init).
	AgentGuestAddr = "10.0.2.15"
	// AgentGuestPort is the agent's data-plane port in the guest.
	AgentGuestPort = silkd.Port
	// agentNetDev names the netdev in QEMU's command line.
	agentNetDev = "agentnet"
	// launchAttempts bounds the launches of a VM whose chosen host port was
	// taken between choosing and QEMU's bind.
	launchAttempts = 3
)

// agentNet is a VM's FileAgentNet: the agent network, and the egress NIC
// the launch gave the VM (its tap and what the guest is told after every
// boot and restore).
type agentNet struct {
	Port   int        `json:"port"`
	Key    string     `json:"key"`
	Egress *EgressNet `json:"egress,omitempty"`
}

// newAgentNet picks a free loopback port and a fresh key.
func newAgentNet() (agentNet, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return agentNet{}, fmt.Errorf("qemu: agent network: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	key, err := agent.NewKey()
	if err != nil {
		return agentNet{}, fmt.Errorf("qemu: agent network: %w", err)
	}
	return agentNet{Port: port, Key: key}, nil
}

func readAgentNet(runDir string) (agentNet, error) {
	var n agentNet
	b, err := os.ReadFile(filepath.Join(runDir, FileAgentNet))
	if err != nil {
		return n, err
	}
	if err := json.Unmarshal(b, &n); err != nil || n.Port <= 0 || n.Port > 65535 || n.Key == "" {
		return n, fmt.Errorf("qemu: %s/%s is damaged (%v)", runDir, FileAgentNet, err)
	}
	return n, nil
}

func writeAgentNet(runDir string, n agentNet) error {
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	return fsx.WriteFileAtomic(filepath.Join(runDir, FileAgentNet), b, 0o600)
}

// args is QEMU's side of the agent network: a user-mode NIC whose guest is
// isolated (restrict=on: no packet from the guest reaches the host or any
// network), with one forward from the host's loopback port to the agent.
// The NIC has no option ROM, so restores never depend on ROM files.
func (n agentNet) args() []string {
	return []string{
		"-netdev", fmt.Sprintf("user,id=%s,restrict=on,hostfwd=tcp:127.0.0.1:%d-%s:%d", agentNetDev, n.Port, AgentGuestAddr, AgentGuestPort),
		"-device", "virtio-net-pci,netdev=" + agentNetDev + ",romfile=",
	}
}

func (n agentNet) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

// hostPortTaken reports whether a launch failed because QEMU could not bind
// the agent network's host port.
func hostPortTaken(err error) bool {
	return errors.Is(err, ErrExited) && strings.Contains(err.Error(), "host forwarding rule")
}

// armAgent gives the guest agent (through a on its serial port) the VM's
// data-plane key. A VM without an agent network has nothing to arm; a guest
// agent that does not know the key verb serves no data plane, which is
// logged, not fatal, so a guest built without one still runs.
func (q *Recipes) armAgent(ctx context.Context, a *agent.Client, runDir string) error {
	n, err := readAgentNet(runDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	err = a.SetKey(ctx, n.Key)
	var re *agent.RemoteError
	if errors.As(err, &re) {
		q.log.Warn().Err(err).Str("run_dir", runDir).Msg("qemu: the guest agent serves no data plane")
	} else if err != nil {
		return fmt.Errorf("qemu: arming the guest agent in %s: %w", runDir, err)
	}
	if n.Egress == nil {
		return nil
	}
	// The guest's egress network: a restored guest holds the golden's
	// (or its own last) MAC and address, which its lock would drop.
	err = a.SetNet(ctx, n.Egress.Guest)
	if errors.As(err, &re) {
		q.log.Error().Err(err).Str("run_dir", runDir).Msg("qemu: the guest agent cannot take its egress network (a guest older than the net verb); its guest reaches nothing")
		return nil
	}
	if err != nil {
		return fmt.Errorf("qemu: giving the guest in %s its egress network: %w", runDir, err)
	}
	return nil
}

// rearm pushes the key again over the serial port, for a guest that refused
// it: a VM adopted after a crash between its launch and its arming.
func (q *Recipes) rearm(ctx context.Context, runDir string) error {
	q.rearmMu.Lock()
	defer q.rearmMu.Unlock()
	a, err := agent.Dial(ctx, AgentSocket(runDir))
	if err != nil {
		return err
	}
	defer a.Close()
	return q.armAgent(ctx, a, runDir)
}

// DialAgent connects to the data plane of the VM in runDir (absolute): TCP
// to its loopback port, then the challenge-response on its key
// (agent.DialData), which refuses a listener that cannot prove the key. A
// guest that refuses the key, or cannot prove it, is given it again over
// the serial port, once; a refused connection is retried until ctx ends
// (the agent may still be starting). Failures wrap
// executors.ErrAgentUnreachable.
func (q *Recipes) DialAgent(ctx context.Context, runDir string) (net.Conn, error) {
	fail := func(err error) (net.Conn, error) {
		return nil, fmt.Errorf("%w: %s: %w", executors.ErrAgentUnreachable, runDir, err)
	}
	n, err := readAgentNet(runDir)
	if errors.Is(err, os.ErrNotExist) {
		return fail(errors.New("no agent network (the VM is not running, or was started without one)"))
	}
	if err != nil {
		return fail(err)
	}
	// A refusal is either the guest holding another key (re-armed once;
	// re-arming needs the VM's serial port, so a process squatting the
	// port of a dead VM fails here) or QEMU's user network closing the
	// connection because nothing in the guest listens yet (an agent still
	// starting after a boot or restore): the two look alike from here, so a
	// refused dial is retried, with a short backoff, until ctx ends.
	backoff, rearmed := 20*time.Millisecond, false
	for {
		c, err := agent.DialData(ctx, n.addr(), n.Key)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, agent.ErrDataRefused) {
			return fail(err)
		}
		if !rearmed {
			rearmed = true
			if rerr := q.rearm(ctx, runDir); rerr != nil {
				return fail(errors.Join(err, rerr))
			}
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fail(errors.Join(err, ctx.Err()))
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

var _ executors.AgentDialer = (*Driver)(nil)

// DialAgent implements executors.AgentDialer (see Recipes.DialAgent).
func (d *Driver) DialAgent(ctx context.Context, rel string) (net.Conn, error) {
	runDir, err := d.roots.InstanceRunDir(d.instance, rel)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", executors.ErrAgentUnreachable, err)
	}
	return d.q.DialAgent(ctx, runDir)
}
