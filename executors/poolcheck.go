package executors

import (
	"errors"
	"fmt"
	"net/netip"
)

// What a driver answers, before anything is proposed, for a pool key it
// cannot serve at all (its PoolSupport check): the API refuses such a
// claim or pool at once with a 4xx instead of letting the boot fail later
// as a 500, or leaving a pool behind.
var (
	// ErrUnknownTemplate: the key's template does not exist on this node.
	ErrUnknownTemplate = errors.New("unknown template")
	// ErrNetUnsupported: this node cannot give the key's net (an egress
	// pool on a node with no bridge, or a driver with no NIC to give).
	ErrNetUnsupported = errors.New("net not supported on this node")
)

// UnknownTemplate is ErrUnknownTemplate naming the template.
func UnknownTemplate(name string) error { return fmt.Errorf("%w %s", ErrUnknownTemplate, name) }

// NetUnsupported is an error that is ErrNetUnsupported and says only the
// reason.
func NetUnsupported(format string, args ...any) error {
	return netUnsupported(fmt.Sprintf(format, args...))
}

type netUnsupported string

func (e netUnsupported) Error() string        { return string(e) }
func (e netUnsupported) Is(target error) bool { return target == ErrNetUnsupported }

// ErrNoBridge is the refusal of an egress pool on a node without a bridge,
// by every driver's CheckPool and by every recipe of such a VM.
var ErrNoBridge = NetUnsupported("net egress needs a bridge (bridge is not configured on this node)")

// EgressDoors opens and closes the egress proxy doors of VMs (the node's
// adapter of executors/egress/proxy.Server), for every driver with egress
// pools.
type EgressDoors interface {
	// Open opens vm's doors: its lock's door tcp when it is on the egress
	// lane, else the vsock doors of its hybrid-vsock socket.
	Open(vm string, tcp netip.AddrPort, vsockSocket string) error
	// Close closes them and every connection through them.
	Close(vm string)
}
