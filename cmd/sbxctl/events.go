package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

func init() {
	register("events", command{summary: "print /v1/events up to now (--follow: and then as they happen, resuming after disconnects)", examples: `sbxctl events                                   # the log so far
sbxctl events --follow --from 100`,
		run: remoteCommand(remoteSpec{name: "events", stream: true, flags: eventsFlags})})
}

// errCaughtUp ends a non-follow stream once it reached the node's end.
var errCaughtUp = errors.New("caught up")

func eventsFlags(fs *flag.FlagSet) remoteBody {
	follow := fs.Bool("follow", false, "keep streaming; reconnect with Last-Event-ID after a disconnect")
	from := fs.Uint64("from", 1, "first sequence to print (log view)")
	view := fs.String("view", "", "vms: the VM view (sync, then changes; root token)")
	idle := fs.Duration("idle", 2*time.Second, "without --follow: stop after this long without an event (a tenant's stream skips others' events, so it may never reach the node's end)")
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		switch *view {
		case "", "log", "vms":
		default:
			return usagef("--view %q: want log or vms", *view)
		}
		vms := *view == "vms"
		p := &eventPrinter{w: cl.stdout, json: cl.json, vms: vms}
		opts := apiclient.EventsOptions{View: *view}
		if !vms {
			opts.From = max(*from, 1)
		}
		if *follow {
			err := c.Follow(ctx, apiclient.FollowOptions{
				EventsOptions: opts,
				OnReconnect: func(err error, last string) {
					at := "the start"
					if last != "" {
						at = "after " + last
					}
					if vms {
						at = "with a fresh sync"
					}
					fmt.Fprintf(cl.stderr, "sbxctl events: stream ended (%v); reconnecting, resuming %s\n", err, at)
				},
			}, p.print)
			if errors.Is(err, context.Canceled) {
				return nil // interrupted: the normal end of --follow
			}
			return err
		}
		return eventsOnce(ctx, c, opts, *idle, p)
	}
}

// eventsOnce prints the events up to the node's current end (the log seq
// /v1/info reports when it starts), or the VM view's sync, and returns. A
// tenant may not read /v1/info: its stream ends at idle.
func eventsOnce(ctx context.Context, c *apiclient.Client, opts apiclient.EventsOptions, idle time.Duration, p *eventPrinter) error {
	var end uint64
	if !p.vms {
		in, err := c.Info(ctx)
		switch {
		case apiclient.StatusOf(err) == http.StatusForbidden:
			end = math.MaxUint64
		case err != nil:
			return err
		default:
			end = in.LogSeq
		}
		if opts.From > end {
			return nil
		}
	}
	s, err := c.Events(ctx, opts)
	if err != nil {
		return err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	var idleTimer *time.Timer
	if idle > 0 {
		idleTimer = time.AfterFunc(idle, func() { s.Close() })
		defer idleTimer.Stop()
	}
	for {
		ev, err := s.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if idleTimer != nil && !idleTimer.Stop() {
				return nil // idle: nothing more for this token
			}
			return err
		}
		if idleTimer != nil {
			idleTimer.Reset(idle)
		}
		if err := p.print(ev); err != nil {
			return err
		}
		if seq, ok := ev.Seq(); p.vms || ok && seq >= end {
			return nil
		}
	}
}

// eventPrinter prints events as a table row each (flushed per event, for
// --follow) or as JSON lines: the log view's data object as is, the VM
// view's {"event", "data"}.
type eventPrinter struct {
	w    io.Writer
	json bool
	vms  bool
	// headed: the table's header line is out (before the first row).
	headed bool
}

// eventHeader heads the log view's table; its columns are print's.
const eventHeader = "SEQ      TIME                     TYPE                     AGGREGATE"

func (p *eventPrinter) print(ev apiclient.Event) error {
	if p.json {
		if p.vms {
			line, _ := json.Marshal(map[string]any{"event": ev.Event, "id": ev.ID, "data": json.RawMessage(ev.Data)})
			_, err := fmt.Fprintf(p.w, "%s\n", line)
			return err
		}
		_, err := fmt.Fprintf(p.w, "%s\n", ev.Data)
		return err
	}
	if p.vms {
		return p.printVM(ev)
	}
	le, err := ev.LogEvent()
	if err != nil {
		return fmt.Errorf("event %s: %w", ev.ID, err)
	}
	if !p.headed {
		p.headed = true
		fmt.Fprintln(p.w, eventHeader)
	}
	_, err = fmt.Fprintf(p.w, "%-8d %-24s %-24s %s/%s\n", le.Seq, shortTime(le.Time), le.Type, le.Aggregate.Kind, le.Aggregate.ID)
	return err
}

func (p *eventPrinter) printVM(ev apiclient.Event) error {
	switch ev.Event {
	case "sync":
		var body struct {
			VMs []api.VM `json:"vms"`
		}
		if err := json.Unmarshal(ev.Data, &body); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		fmt.Fprintf(p.w, "SYNC %d VMs\n", len(body.VMs))
		for _, vm := range body.VMs {
			p.vmLine("", vm)
		}
	case "change":
		var ch api.VMChange
		if err := json.Unmarshal(ev.Data, &ch); err != nil {
			return fmt.Errorf("change: %w", err)
		}
		p.vmLine(ch.Type, ch.VM)
	default:
		fmt.Fprintf(p.w, "%s %s\n", ev.Event, ev.Data)
	}
	return nil
}

func (p *eventPrinter) vmLine(change string, vm api.VM) {
	fmt.Fprintf(p.w, "%-9s %-22s %-12s gen %-4d %-24s %s\n", orDash(change), vm.Name, vm.State, vm.Generation, vm.Pool, orDash(vm.Claim))
}
