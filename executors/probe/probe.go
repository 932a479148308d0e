// Package probe decides when a restored, woken or cold-booted VM is ready: its VMM
// reports the VM Running and the guest agent accepts a connection on its vsock port.
//
// The vsock check uses Cloud Hypervisor's hybrid vsock: the VM's vsock device is a
// unix socket on the host; a client connects to it, writes "CONNECT <port>\n", and
// the VMM answers "OK <host port>\n" once a guest listener on <port> has accepted
// (otherwise it closes the connection). The probe retries every Interval (20 ms, as
// the old daemon did) until it gets an OK or its timeout or context ends, and never
// leaves a connection open but the one ReadyConn hands to its caller.
//
// Contract:
//   - Connect makes one attempt and returns nil only on an "OK " answer.
//   - Vsock retries Connect; Ready first waits for the injected RunningFunc (vm.info
//     in production, kept a func so this package does not depend on the CH client)
//     to report true, then runs Vsock. Both report attempts so recipes can log them.
//   - ReadyConn is Ready that hands back the successful attempt's connection, open
//     (the caller's to close), so the caller's first exchange with the agent needs no
//     second handshake; every other attempt's connection is closed.
//   - Giving up returns an error wrapping ErrNotReady, the context's error and the
//     last attempt's error; an error from RunningFunc is returned at once, wrapped.
//   - ErrInvalid: empty socket path or nil RunningFunc.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sbxlog/sbxlog/executors/hvsock"
)

const (
	// DefaultInterval is the pause between attempts.
	DefaultInterval = 20 * time.Millisecond
	// DefaultAttemptTimeout bounds one dial plus answer: a VMM that has accepted the
	// connection but whose guest never answers must not stall the whole probe.
	DefaultAttemptTimeout = time.Second
)

var (
	// ErrNotReady: the VM did not become ready before the timeout or context end.
	ErrNotReady = errors.New("probe: vm not ready")
	// ErrInvalid: the probe was called with unusable arguments.
	ErrInvalid = errors.New("probe: invalid arguments")
)

// Options tunes a probe; zero values take the defaults.
type Options struct {
	// Interval between attempts (DefaultInterval).
	Interval time.Duration
	// Timeout for the whole probe; 0 leaves it to the context.
	Timeout time.Duration
	// AttemptTimeout for one dial plus answer (DefaultAttemptTimeout).
	AttemptTimeout time.Duration
	// OnAttempt, if set, is called after every failed attempt with its number
	// (from 1) and error, e.g. to log at debug level.
	OnAttempt func(n int, err error)
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = DefaultAttemptTimeout
	}
	return o
}

// Result says how much waiting the probe took.
type Result struct {
	// RunningChecks is how many times RunningFunc was called (Ready only).
	RunningChecks int
	// Attempts is how many vsock handshakes were tried.
	Attempts int
}

// Connect performs one hybrid-vsock handshake with the guest's port via the VM's
// vsock unix socket (package hvsock), and closes the connection.
func Connect(ctx context.Context, socket string, port uint32) error {
	if socket == "" {
		return fmt.Errorf("%w: empty vsock socket path", ErrInvalid)
	}
	conn, err := hvsock.Dial(ctx, socket, port)
	if err != nil {
		return err
	}
	return conn.Close()
}

// Vsock retries Connect until it succeeds or the probe times out.
func Vsock(ctx context.Context, socket string, port uint32, opt Options) (Result, error) {
	return wait(ctx, nil, socket, port, opt, nil)
}

// vsock retries the handshake; keep, if not nil, receives the successful
// attempt's connection, open, instead of its being closed.
func vsock(ctx context.Context, socket string, port uint32, opt Options, res *Result, keep **net.UnixConn) error {
	return retry(ctx, opt, func() (bool, error) {
		res.Attempts++
		actx, cancel := context.WithTimeout(ctx, opt.AttemptTimeout)
		var err error
		if keep == nil {
			err = Connect(actx, socket, port)
		} else {
			// hvsock.Dial clears the attempt's deadline from the
			// connection it returns.
			*keep, err = hvsock.Dial(actx, socket, port)
		}
		cancel()
		if err != nil && opt.OnAttempt != nil {
			opt.OnAttempt(res.Attempts, err)
		}
		return err == nil, err
	}, fmt.Sprintf("vsock %s port %d", socket, port))
}

// RunningFunc reports whether the VM is running (vm.info state Running). It returns
// (false, nil) while the VM may still get there, and an error when it will not
// (the VMM is gone, the VM shut down): that error ends the probe at once.
type RunningFunc func(ctx context.Context) (bool, error)

// Ready waits until running reports true, then until the guest answers on port.
func Ready(ctx context.Context, running RunningFunc, socket string, port uint32, opt Options) (Result, error) {
	if running == nil {
		return Result{}, fmt.Errorf("%w: nil RunningFunc", ErrInvalid)
	}
	return wait(ctx, running, socket, port, opt, nil)
}

// ReadyConn is Ready that returns the connection of the handshake that
// succeeded, open: the caller speaks to the guest's agent over it and closes it.
// It is nil when the probe fails.
func ReadyConn(ctx context.Context, running RunningFunc, socket string, port uint32, opt Options) (*net.UnixConn, Result, error) {
	if running == nil {
		return nil, Result{}, fmt.Errorf("%w: nil RunningFunc", ErrInvalid)
	}
	var conn *net.UnixConn
	res, err := wait(ctx, running, socket, port, opt, &conn)
	if err != nil {
		return nil, res, err
	}
	return conn, res, nil
}

// wait is Ready, with the running check skipped when running is nil; keep as
// vsock's.
func wait(ctx context.Context, running RunningFunc, socket string, port uint32, opt Options, keep **net.UnixConn) (Result, error) {
	var res Result
	if socket == "" {
		return res, fmt.Errorf("%w: empty vsock socket path", ErrInvalid)
	}
	opt = opt.withDefaults()
	if opt.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opt.Timeout)
		defer cancel()
	}
	if running != nil {
		var fatal error
		err := retry(ctx, opt, func() (bool, error) {
			res.RunningChecks++
			ok, err := running(ctx)
			if err != nil {
				fatal = err
				return true, nil // stop retrying; reported below
			}
			if !ok {
				return false, errors.New("vm not running yet")
			}
			return true, nil
		}, "vm running")
		if fatal != nil {
			return res, fmt.Errorf("probe: vm state: %w", fatal)
		}
		if err != nil {
			return res, err
		}
	}
	return res, vsock(ctx, socket, port, opt, &res, keep)
}

// retry calls try until it reports done, pausing opt.Interval between calls, and
// gives up when ctx ends.
func retry(ctx context.Context, opt Options, try func() (bool, error), what string) error {
	var t *time.Timer
	var prev error
	for {
		done, err := try()
		if done {
			return nil
		}
		if ctx.Err() != nil || pastDeadline(ctx) {
			// An attempt the context's end cut short tells nothing about the
			// VM; the one before it does. The deadline is checked too: a dial
			// bound by it can fail before the context's own timer marks it done.
			if prev != nil {
				err = prev
			}
			cause := ctx.Err()
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			return fmt.Errorf("%w: %s: %w (last: %w)", ErrNotReady, what, cause, err)
		}
		prev = err
		if t == nil {
			t = time.NewTimer(opt.Interval)
			defer t.Stop()
		} else {
			t.Reset(opt.Interval)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: %w (last: %w)", ErrNotReady, what, ctx.Err(), err)
		case <-t.C:
		}
	}
}

func pastDeadline(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}
