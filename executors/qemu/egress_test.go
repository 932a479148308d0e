package qemu

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/executors/egress/nft"
	"github.com/sbxlog/sbxlog/executors/guest/agent"
	"github.com/sbxlog/sbxlog/executors/tap"
)

// TestEgressArgs: the egress NIC sits at its fixed PCI slot, on the VM's
// tap with the VM's MAC and no vnet header, or without a backend (a golden).
func TestEgressArgs(t *testing.T) {
	golden := strings.Join(egressArgs(nil), " ")
	if strings.Contains(golden, "-netdev") || !strings.Contains(golden, "virtio-net-pci,id=egressnic,addr=0x10,romfile=") {
		t.Fatalf("golden's egress NIC: %s", golden)
	}
	eg := &EgressNet{Tap: "sbxabcdefghijkl", Guest: agent.NetConfig{MAC: "02:01:02:03:04:05"}}
	got := strings.Join(egressArgs(eg), " ")
	for _, want := range []string{"-netdev tap,id=egress,ifname=sbxabcdefghijkl,script=no,downscript=no,vnet_hdr=off",
		"virtio-net-pci,id=egressnic,addr=0x10,romfile=,netdev=egress,mac=02:01:02:03:04:05"} {
		if !strings.Contains(got, want) {
			t.Fatalf("egress NIC args lack %q: %s", want, got)
		}
	}
	if egressPCI != "0000:00:10.0" {
		t.Fatalf("egressPCI %q", egressPCI)
	}
}

// TestLaunchRefusesEgressWithoutNIC: a restore whose snapshot has no egress
// NIC (made for a pool without egress) cannot be given a tap.
func TestLaunchRefusesEgressWithoutNIC(t *testing.T) {
	q, err := NewRecipes(RecipesConfig{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = q.launch(context.Background(), t.TempDir(), Meta{AgentNet: true}, true, &EgressNet{Tap: "sbxx"})
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("launch: %v, want ErrInvalidSpec", err)
	}
}

// fakeLane records locks and unlocks.
type fakeLane struct {
	locked   map[string]nft.Lease
	unlocked []string
}

func (l *fakeLane) Lock(vm, _ string, _ net.HardwareAddr) (nft.Lease, error) {
	ls := nft.Lease{Door: netip.MustParseAddrPort("10.77.0.1:20001"), Guest: netip.MustParsePrefix("10.77.0.9/24")}
	l.locked[vm] = ls
	return ls, nil
}
func (l *fakeLane) Unlock(vm, _ string, _ net.HardwareAddr) error {
	delete(l.locked, vm)
	l.unlocked = append(l.unlocked, vm)
	return nil
}
func (l *fakeLane) Lease(vm string) (nft.Lease, bool) { ls, ok := l.locked[vm]; return ls, ok }
func (l *fakeLane) Reconcile([]nft.Member) (nft.Report, error) {
	return nft.Report{}, nil
}

type fakeTaps struct{ ops []string }

func (f *fakeTaps) Create(name, _ string) error { f.ops = append(f.ops, "create "+name); return nil }
func (f *fakeTaps) Delete(name string) error    { f.ops = append(f.ops, "delete "+name); return nil }

// TestAttachEgress: a VM's tap is made, then locked; the guest is told the
// lease (address, gateway the door, proxy the door's URL), its MAC (the
// instance's derivation) and the node CA; detaching deletes the tap before
// the unlock.
func TestAttachEgress(t *testing.T) {
	lane, taps := &fakeLane{locked: map[string]nft.Lease{}}, &fakeTaps{}
	d := &Driver{instance: "i-egress", egress: &Egress{Bridge: "br0", Lane: lane, Taps: taps, CAPEM: []byte("-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n")}}
	eg, err := d.attachEgress("vm1")
	if err != nil {
		t.Fatal(err)
	}
	name := tap.Name("i-egress", "vm1")
	want := agent.NetConfig{V: agent.NetConfigVersion, PCI: "0000:00:10.0", MAC: tap.MAC("i-egress", "vm1").String(),
		Addr: "10.77.0.9/24", Gateway: "10.77.0.1", Proxy: "http://10.77.0.1:20001", CA: string(d.egress.CAPEM)}
	if eg.Tap != name || eg.Guest != want {
		t.Fatalf("egress net %+v, want tap %s and %+v", eg, name, want)
	}
	if err := eg.Guest.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := d.detachEgress("vm1"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(taps.ops, []string{"create " + name, "delete " + name}) || !slices.Equal(lane.unlocked, []string{"vm1"}) {
		t.Fatalf("taps %v, unlocked %v", taps.ops, lane.unlocked)
	}
	if tap.MAC("i-egress", "vm1").String() == tap.MAC("i-other", "vm1").String() {
		t.Fatal("two instances' VMs of one id share a MAC")
	}
}
