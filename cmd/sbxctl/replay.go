package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/engine"
)

func init() {
	register("replay", command{summary: "rebuild the state from an op log (at --until SEQ) and print it with its hash", examples: `sbxctl replay --data ./data --until 120`, run: logCommand("replay", replayFlags)})
}

var replayShows = []string{"pools", "claims", "vms", "intents"}

func replayFlags(fs *flag.FlagSet) logBody {
	until := fs.Uint64("until", 0, "apply events up to this sequence (0: to the end)")
	show := fs.String("show", "pools", "what to list: "+strings.Join(replayShows, "|"))
	asJSON := fs.Bool("json", false, "print one JSON object")
	noSnap := fs.Bool("no-snapshot", false, "replay every event instead of starting from the latest snapshot")
	check := fs.Bool("check", false, "verify the state's invariants; exit 1 if they fail")
	return func(l *eventlog.Log, stdout, stderr io.Writer) int {
		if !slices.Contains(replayShows, *show) {
			fmt.Fprintf(stderr, "sbxctl replay: --show %q: want one of %s\n", *show, strings.Join(replayShows, ", "))
			return 2
		}
		res, err := engine.Rebuild(l, engine.RebuildOptions{Until: *until, NoSnapshot: *noSnap})
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl replay: %v\n", err)
			return 1
		}
		var checkErr error
		if *check {
			checkErr = res.State.Check()
		}
		out := replayView(l, res, *show, checkErr)
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(out); err != nil {
				fmt.Fprintf(stderr, "sbxctl replay: %v\n", err)
				return 1
			}
		} else if err := out.text(stdout, *show); err != nil {
			fmt.Fprintf(stderr, "sbxctl replay: %v\n", err)
			return 1
		}
		if checkErr != nil {
			fmt.Fprintf(stderr, "sbxctl replay: invariants fail: %v\n", checkErr)
			return 1
		}
		return 0
	}
}

// replayOut is `sbxctl replay --json`'s object (and the text view's data).
type replayOut struct {
	Node            string         `json:"node"`
	Instance        string         `json:"instance"`
	Seq             uint64         `json:"seq"`
	FirstSeq        uint64         `json:"first_seq"`
	LastSeq         uint64         `json:"last_seq"`
	SnapshotSeq     uint64         `json:"snapshot_seq"`
	SnapshotSkipped string         `json:"snapshot_skipped,omitempty"`
	Events          int            `json:"events"`
	ElapsedMS       float64        `json:"elapsed_ms"`
	EventsPerSec    float64        `json:"events_per_sec"`
	Hash            string         `json:"hash"`
	Check           string         `json:"check,omitempty"`
	Claims          map[string]int `json:"claims"`
	LiveClaims      int            `json:"live_claims"`
	VMs             map[string]int `json:"vms"`
	AtCapacity      bool           `json:"at_capacity"`
	Pools           []poolOut      `json:"pools,omitempty"`
	ClaimList       []claimOut     `json:"claim_list,omitempty"`
	VMList          []vmOut        `json:"vm_list,omitempty"`
	Intents         []intentOut    `json:"intents,omitempty"`
}

type poolOut struct {
	Key        string `json:"key"`
	Warm       int    `json:"warm"`
	Refilling  int    `json:"refilling"`
	Target     int    `json:"target"`
	WarmMax    int    `json:"warm_max"`
	Golden     string `json:"golden"`
	Draining   bool   `json:"draining"`
	AtCapacity bool   `json:"at_capacity"`
	Parked     bool   `json:"parked"`
	VMs        int    `json:"vms"`
	Live       int    `json:"live_claims"`
}

type claimOut struct {
	ID       string            `json:"id"`
	Status   string            `json:"status"`
	Tier     string            `json:"tier"`
	Pool     string            `json:"pool"`
	VM       string            `json:"vm"`
	Tenant   string            `json:"tenant,omitempty"`
	ClaimRef string            `json:"claim_ref,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Deadline string            `json:"deadline"`
	Reason   string            `json:"reason,omitempty"`
}

type vmOut struct {
	ID          string `json:"id"`
	Status      string `json:"status"`
	Pool        string `json:"pool"`
	Claim       string `json:"claim,omitempty"`
	RunDir      string `json:"run_dir"`
	SnapshotDir string `json:"snapshot_dir,omitempty"`
}

type intentOut struct {
	Kind   string `json:"kind"`
	OpID   string `json:"op_id"`
	Target string `json:"target"`
	Claim  string `json:"claim,omitempty"`
	Detail string `json:"detail,omitempty"`
}

func replayView(l *eventlog.Log, res *engine.Rebuilt, show string, checkErr error) *replayOut {
	s := res.State
	info := s.Info()
	out := &replayOut{
		Node: s.Node(), Instance: s.Instance(), Seq: res.Seq, FirstSeq: l.FirstSeq(), LastSeq: l.LastSeq(),
		SnapshotSeq: res.SnapshotSeq, Events: res.Events, ElapsedMS: float64(res.Elapsed.Microseconds()) / 1000,
		EventsPerSec: res.EventsPerSec(), Hash: fsm.HashHex(s), LiveClaims: info.Live, AtCapacity: info.AtCapacity,
		Claims: map[string]int{}, VMs: map[string]int{},
	}
	if res.SnapshotErr != nil {
		out.SnapshotSkipped = res.SnapshotErr.Error()
	}
	if checkErr != nil {
		out.Check = checkErr.Error()
	} else {
		out.Check = "ok"
	}
	for st := fsm.ClaimPending; st <= fsm.ClaimFailed; st++ {
		out.Claims[st.String()] = info.Count(st)
	}
	for st := fsm.VMCloning; st <= fsm.VMDestroying; st++ {
		out.VMs[st.String()] = info.CountVMs(st)
	}
	switch show {
	case "pools":
		for _, p := range info.Pools {
			out.Pools = append(out.Pools, poolOut{Key: p.Key.String(), Warm: p.Warm, Refilling: p.Refilling, Target: p.Target,
				WarmMax: p.WarmMax, Golden: p.Golden.String(), Draining: p.Draining, AtCapacity: p.AtCapacity, Parked: p.Parked, VMs: p.VMs, Live: p.Live})
		}
	case "claims":
		for _, id := range s.ClaimIDs() {
			c, _ := s.Claim(id)
			out.ClaimList = append(out.ClaimList, claimOut{ID: c.ID, Status: c.Status.String(), Tier: c.Tier.String(), Pool: c.Key.String(),
				VM: c.VM, Tenant: c.Tenant, ClaimRef: c.ClaimRef, Metadata: c.Metadata, Deadline: formatTime(c.Deadline), Reason: c.Reason})
		}
	case "vms":
		for _, id := range s.VMIDs() {
			v, _ := s.VM(id)
			out.VMList = append(out.VMList, vmOut{ID: v.ID, Status: v.Status.String(), Pool: v.Key.String(), Claim: v.Claim, RunDir: v.RunDir, SnapshotDir: v.SnapshotDir})
		}
	case "intents":
		for _, in := range fsm.Intents(s) {
			out.Intents = append(out.Intents, intentView(in))
		}
	}
	return out
}

func intentView(in fsm.Intent) intentOut {
	o := intentOut{OpID: in.IntentOp().String()}
	switch in := in.(type) {
	case fsm.BuildGolden:
		o.Kind, o.Target = "build_golden", in.Key.String()
	case fsm.CloneVM:
		o.Kind, o.Target, o.Claim = "clone", in.VM, in.ForClaim
		o.Detail = "pool " + in.Key.String()
		if in.Cold {
			o.Detail += ", cold boot"
		}
	case fsm.HibernateVM:
		o.Kind, o.Target, o.Claim = "hibernate", in.VM, in.Claim
	case fsm.WakeVM:
		o.Kind, o.Target, o.Claim, o.Detail = "wake", in.VM, in.Claim, "from "+in.SnapshotDir
	case fsm.DestroyVM:
		o.Kind, o.Target = "destroy", in.VM
		if in.SnapshotDir != "" {
			o.Detail = "and " + in.SnapshotDir
		}
	}
	return o
}

func (o *replayOut) text(w io.Writer, show string) error {
	src := "full replay"
	if o.SnapshotSeq > 0 {
		src = fmt.Sprintf("snapshot at %d", o.SnapshotSeq)
	}
	fmt.Fprintf(w, "seq %d of %d..%d (node %s, instance %s): %s + %d events in %.3f ms (%.0f events/s)\n",
		o.Seq, o.FirstSeq, o.LastSeq, o.Node, o.Instance, src, o.Events, o.ElapsedMS, o.EventsPerSec)
	if o.SnapshotSkipped != "" {
		fmt.Fprintf(w, "snapshot skipped: %s\n", o.SnapshotSkipped)
	}
	fmt.Fprintf(w, "hash %s\n", o.Hash)
	var cl, vm []string
	for st := fsm.ClaimPending; st <= fsm.ClaimFailed; st++ {
		cl = append(cl, fmt.Sprintf("%s %d", st, o.Claims[st.String()]))
	}
	for st := fsm.VMCloning; st <= fsm.VMDestroying; st++ {
		vm = append(vm, fmt.Sprintf("%s %d", st, o.VMs[st.String()]))
	}
	fmt.Fprintf(w, "claims: %s (live %d)\nvms: %s\n", strings.Join(cl, ", "), o.LiveClaims, strings.Join(vm, ", "))
	if o.AtCapacity {
		fmt.Fprintln(w, "node at capacity: refills parked")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	switch show {
	case "pools":
		fmt.Fprintln(tw, "POOL\tWARM\tREFILLING\tTARGET\tWARM_MAX\tGOLDEN\tDRAINING\tAT_CAPACITY\tVMS\tLIVE")
		for _, p := range o.Pools {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%v\t%v\t%d\t%d\n", p.Key, p.Warm, p.Refilling, p.Target, p.WarmMax, p.Golden, p.Draining, p.AtCapacity, p.VMs, p.Live)
		}
	case "claims":
		fmt.Fprintln(tw, "ID\tSTATUS\tTIER\tPOOL\tVM\tTENANT\tDEADLINE\tCLAIM_REF")
		for _, c := range o.ClaimList {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Status, c.Tier, c.Pool, c.VM, c.Tenant, c.Deadline, c.ClaimRef)
		}
	case "vms":
		fmt.Fprintln(tw, "ID\tSTATUS\tPOOL\tCLAIM\tRUN_DIR\tSNAPSHOT")
		for _, v := range o.VMList {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.ID, v.Status, v.Pool, v.Claim, v.RunDir, v.SnapshotDir)
		}
	case "intents":
		fmt.Fprintln(tw, "KIND\tTARGET\tCLAIM\tOP_ID\tDETAIL")
		for _, in := range o.Intents {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", in.Kind, in.Target, in.Claim, in.OpID, in.Detail)
		}
	}
	return tw.Flush()
}
