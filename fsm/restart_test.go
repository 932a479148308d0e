package fsm

import (
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// The restart policy: a claimed VM whose VMM dies is booted again from its
// own disk, at most Max times within WindowNS, then its claim fails.
func TestRestartPolicy(t *testing.T) {
	pol := DefaultRestartPolicy
	// exit reports c's VM dead and requires the events want.
	exit := func(h *harness, c ClaimRec, p RestartPolicy, want ...event.Type) []event.Event {
		h.t.Helper()
		return h.do(VMExited{Meta: h.meta(), VM: c.VM, Detail: "signal: killed", Restart: p}, want...)
	}
	restarted := func(h *harness, vm string, want ...event.Type) {
		h.t.Helper()
		h.do(VMRestarted{Meta: h.res(h.intentFor(vm, kA)), VM: vm}, want...)
	}
	cases := []struct {
		name string
		run  func(t *testing.T, h *harness, c ClaimRec)
	}{
		{"exit restarts the VM; the claim keeps running", func(t *testing.T, h *harness, c ClaimRec) {
			evs := exit(h, c, pol, event.TypeVMExited, event.TypeVMRestartRequested)
			p := payload[event.VMRestartRequested](t, evs, 1)
			if p.Attempt != 1 || p.Claim != c.ID || p.Reason != "exited" || evs[1].AggID != c.VM {
				t.Fatalf("restart request %+v on %s", p, evs[1].AggID)
			}
			in, ok := h.intentFor(c.VM, kA).(RestartVM)
			if !ok || in.Claim != c.ID || in.RunDir != "i1/"+c.VM || in.Instance != "i1" {
				t.Fatalf("intent %+v", h.intentFor(c.VM, kA))
			}
			if v := h.vm(c.VM); v.Status != VMRestarting || len(v.Restarts) != 1 || v.Restarts[0] != h.now {
				t.Fatalf("VM %+v", v)
			}
			if h.claim(c.ID).Status != ClaimRunning {
				t.Fatal("claim left running")
			}
			// While it restarts the VM is not running: no hibernate, and
			// a second report of the same death is refused.
			h.rejects(Hibernate{Meta: h.meta(), Claim: c.ID}, InvalidTransition)
			h.rejects(VMExited{Meta: h.meta(), VM: c.VM, Restart: pol}, InvalidTransition)
			h.rejects(VMRestarted{Meta: h.meta(), VM: c.VM}, InvalidTransition) // wrong cause
			h.advance(5 * second)
			restarted(h, c.VM, event.TypeVMRestarted)
			if v := h.vm(c.VM); v.Status != VMClaimed || v.Op != event.ZeroOpID {
				t.Fatalf("VM %+v after restart", v)
			}
			if h.claim(c.ID).LastActivity != h.now {
				t.Fatal("a restart is activity: the idle timer should start over")
			}
			h.do(Hibernate{Meta: h.meta(), Claim: c.ID}, event.TypeHibernateRequested)
		}},
		{"after Max restarts in the window the claim fails", func(t *testing.T, h *harness, c ClaimRec) {
			for i := 1; i <= pol.Max; i++ {
				evs := exit(h, c, pol, event.TypeVMExited, event.TypeVMRestartRequested)
				if a := payload[event.VMRestartRequested](t, evs, 1).Attempt; a != i {
					t.Fatalf("attempt %d, want %d", a, i)
				}
				restarted(h, c.VM, event.TypeVMRestarted)
				h.advance(pol.WindowNS / 10)
			}
			evs := exit(h, c, pol, event.TypeVMExited, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			f := payload[event.ClaimFailed](t, evs, 1)
			if f.Reason != "vm_exited" || !strings.Contains(f.Error, "restarted 3 times within 10m") {
				t.Fatalf("claim failed %+v", f)
			}
			if payload[event.VMDestroyRequested](t, evs, 2).Reason != "exited" {
				t.Fatal("destroy reason")
			}
		}},
		{"restarts older than the window do not count", func(t *testing.T, h *harness, c ClaimRec) {
			for range pol.Max {
				exit(h, c, pol, event.TypeVMExited, event.TypeVMRestartRequested)
				restarted(h, c.VM, event.TypeVMRestarted)
			}
			h.advance(pol.WindowNS) // the first restarts are now exactly a window old
			evs := exit(h, c, pol, event.TypeVMExited, event.TypeVMRestartRequested)
			if a := payload[event.VMRestartRequested](t, evs, 1).Attempt; a != 1 {
				t.Fatalf("attempt %d, want 1", a)
			}
		}},
		{"the zero policy fails the claim at once", func(t *testing.T, h *harness, c ClaimRec) {
			evs := exit(h, c, RestartPolicy{}, event.TypeVMExited, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if f := payload[event.ClaimFailed](t, evs, 1); f.Error != "signal: killed" {
				t.Fatalf("error %q", f.Error)
			}
		}},
		{"a failed restart fails the claim and destroys the VM", func(t *testing.T, h *harness, c ClaimRec) {
			exit(h, c, pol, event.TypeVMExited, event.TypeVMRestartRequested)
			in := h.intentFor(c.VM, kA)
			evs := h.do(VMRestartFailed{Meta: h.res(in), VM: c.VM, Error: "vm.boot: 500"},
				event.TypeVMRestartFailed, event.TypeClaimFailed, event.TypeVMDestroyRequested)
			if f := payload[event.ClaimFailed](t, evs, 1); f.Reason != "restart_failed" || f.Error != "vm.boot: 500" {
				t.Fatalf("claim failed %+v", f)
			}
			if payload[event.VMDestroyRequested](t, evs, 2).Reason != "failed" {
				t.Fatal("destroy reason")
			}
			h.rejects(VMRestartFailed{Meta: h.res(in), VM: c.VM}, InvalidTransition)
		}},
		{"a claim released while its VM restarts: the VM is destroyed once it settles", func(t *testing.T, h *harness, c ClaimRec) {
			exit(h, c, pol, event.TypeVMExited, event.TypeVMRestartRequested)
			h.do(Release{Meta: h.meta(), Claim: c.ID}, event.TypeClaimReleased)
			evs := h.do(VMRestarted{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM}, event.TypeVMRestarted, event.TypeVMDestroyRequested)
			if payload[event.VMDestroyRequested](t, evs, 1).Reason != "claim_ended" {
				t.Fatal("destroy reason")
			}
		}},
		{"a claim expiring while its VM restarts; the restart then fails", func(t *testing.T, h *harness, c ClaimRec) {
			exit(h, c, pol, event.TypeVMExited, event.TypeVMRestartRequested)
			h.advance(DefaultTTLSeconds * second)
			h.do(Tick{Meta: h.meta()}, event.TypeClaimExpired)
			evs := h.do(VMRestartFailed{Meta: h.res(h.intentFor(c.VM, kA)), VM: c.VM, Error: "x"}, event.TypeVMRestartFailed, event.TypeVMDestroyRequested)
			if payload[event.VMDestroyRequested](t, evs, 1).Reason != "claim_ended" {
				t.Fatal("destroy reason")
			}
		}},
		{"a warm VM is replaced, never restarted", func(t *testing.T, h *harness, c ClaimRec) {
			p, _ := h.s.Pool(kA)
			warm := p.WarmVMs()[0]
			h.do(VMExited{Meta: h.meta(), VM: warm, Restart: pol}, event.TypeVMExited, event.TypeVMDestroyRequested)
		}},
		{"the history keeps the most recent MaxRestartHistory restarts", func(t *testing.T, h *harness, c ClaimRec) {
			fast := RestartPolicy{Max: MaxRestartHistory, WindowNS: second}
			for range MaxRestartHistory + 4 {
				exit(h, c, fast, event.TypeVMExited, event.TypeVMRestartRequested)
				restarted(h, c.VM, event.TypeVMRestarted)
				h.advance(2 * second)
			}
			v := h.vm(c.VM)
			if len(v.Restarts) != MaxRestartHistory || v.Restarts[MaxRestartHistory-1] != h.now-2*second {
				t.Fatalf("history %v", v.Restarts)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.setup(2)
			tc.run(t, h, h.claimWarm(1, kA))
		})
	}
}

func TestRestartPolicyRejections(t *testing.T) {
	h := newHarness(t)
	h.setup(1)
	c := h.claimWarm(1, kA)
	for _, p := range []RestartPolicy{{Max: -1}, {Max: MaxRestartHistory + 1}, {Max: 1, WindowNS: -1}} {
		h.rejects(VMExited{Meta: h.meta(), VM: c.VM, Restart: p}, Invalid)
	}
	h.rejects(VMRestarted{Meta: h.meta(), VM: "vm-x"}, NotFound)
	h.rejects(VMRestartFailed{Meta: h.meta(), VM: c.VM}, InvalidTransition)
}
