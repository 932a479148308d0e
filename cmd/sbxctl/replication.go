package main

// The replication consumers as standalone commands, reading
// the nodes' op logs from a NATS JetStream stream: follow keeps a verified
// replica of one node's log, usage and audit write the billing and audit
// journals of any number of nodes. sandboxd runs usage and audit for its own
// node already (<data>/usage.jsonl, <data>/audit.jsonl); these are for a
// central host or a replacement.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sbxlog/sbxlog/eventlog"
	"github.com/sbxlog/sbxlog/eventlog/replication/feed"
	"github.com/sbxlog/sbxlog/eventlog/replication/follower"
	"github.com/sbxlog/sbxlog/eventlog/replication/natsauth"
	"github.com/sbxlog/sbxlog/eventlog/replication/replicator"
	"github.com/sbxlog/sbxlog/eventlog/replication/stream"
	"github.com/sbxlog/sbxlog/projections/audit"
	usagejournal "github.com/sbxlog/sbxlog/projections/usage"
)

// Where the replication commands find NATS and their credentials: --nats,
// else $SBX_NATS_URL, else the embedded server of a sandboxd on the
// default listen address. Credentials: --creds, --user/--password,
// --token, or --nkey (default $SBX_NATS_NKEY, else data/nats.nk: the seed
// sandboxd generates for its embedded server, read from the working
// directory as data/api.token is; used when it exists). Passwords and
// tokens may come from $SBX_NATS_PASSWORD and $SBX_NATS_TOKEN instead of
// the command line.
const (
	envNATS         = "SBX_NATS_URL"
	envNATSNKey     = "SBX_NATS_NKEY"
	envNATSPassword = "SBX_NATS_PASSWORD"
	envNATSToken    = "SBX_NATS_TOKEN"
	// defaultNATS is the embedded server of a sandboxd on the default
	// listen address (127.0.0.1:7777 -> NATS on port 8777).
	defaultNATS = "nats://127.0.0.1:8777"
	// defaultNKey is relative to the working directory, like
	// defaultTokenFile.
	defaultNKey = "data/" + natsauth.SeedFileName
)

func init() {
	register("follow", command{summary: "keep a verified replica of a node's op log from NATS (--node N --data DIR)", examples: `sbxctl follow --node node-1 --data ./replica`, run: replFollow})
	register("usage", command{summary: "write usage.jsonl (billing records, one summary per sandbox) from NATS (--out FILE)", examples: `sbxctl usage --out usage.jsonl`, run: replJournal("usage")})
	register("audit", command{summary: "write audit.jsonl (one record per event) from NATS (--out FILE)", examples: `sbxctl audit --out audit.jsonl`, run: replJournal("audit")})
}

// replFlags are the flags every replication command takes.
type replFlags struct {
	url, stream, prefix, durable, logLevel string
	auth                                   natsauth.Config
	once                                   bool
	fs                                     *flag.FlagSet
}

func (r *replFlags) add(fs *flag.FlagSet, durableHelp string) {
	url := defaultNATS
	if env := os.Getenv(envNATS); env != "" {
		url = env
	}
	r.fs = fs
	fs.StringVar(&r.url, "nats", url, "NATS server URLs, comma-separated ($"+envNATS+")")
	fs.StringVar(&r.auth.CredsFile, "creds", "", "NATS creds file (user JWT and seed)")
	fs.StringVar(&r.auth.NKeySeedFile, "nkey", envOr(envNATSNKey, defaultNKey), "NATS user NKey seed file, used when it exists unless another credential is given ($"+envNATSNKey+"; sandboxd writes <data>/nats.nk for its embedded server)")
	fs.StringVar(&r.auth.User, "user", "", "NATS user (password from --password or $"+envNATSPassword+")")
	// No environment value as a flag default: -h would print it.
	fs.StringVar(&r.auth.Password, "password", "", "NATS password (default $"+envNATSPassword+")")
	fs.StringVar(&r.auth.Token, "nats-token", "", "NATS token (default $"+envNATSToken+")")
	fs.StringVar(&r.auth.TLSCA, "tls-ca", "", "CA file the NATS server's certificate must chain to (turns TLS on)")
	fs.StringVar(&r.auth.TLSCert, "tls-cert", "", "TLS client certificate for NATS (with --tls-key)")
	fs.StringVar(&r.auth.TLSKey, "tls-key", "", "TLS client key for NATS")
	fs.StringVar(&r.stream, "stream", stream.DefaultName, "JetStream stream (sandboxd's nats.stream)")
	fs.StringVar(&r.prefix, "subject-prefix", stream.DefaultSubjectPrefix, "subject prefix of the nodes' subjects (sandboxd's nats.subject_prefix)")
	fs.StringVar(&r.durable, "durable", "", "durable consumer name ("+durableHelp+")")
	fs.BoolVar(&r.once, "once", false, "stop once caught up with the stream's end at start, instead of following until SIGINT/SIGTERM")
	fs.StringVar(&r.logLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
}

// parse parses args, refusing positional arguments; it returns the exit
// code to return, or -1 to go on.
func parseRepl(fs *flag.FlagSet, name string, args []string, stderr io.Writer) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sbxctl %s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	return -1
}

func (r *replFlags) logger(stderr io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(r.logLevel)
	if err != nil || r.logLevel == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want debug, info, warn or error", r.logLevel)
	}
	return zerolog.New(stderr).Level(lvl).With().Timestamp().Logger(), nil
}

// layout is the stream and subject prefix the flags name.
func (r *replFlags) layout() stream.Config {
	return stream.Config{Name: r.stream, SubjectPrefix: r.prefix}
}

// credentials are the flags' credentials. The default seed file counts
// only when it exists and no other credential is given; a seed file named
// by --nkey or $SBX_NATS_NKEY must exist.
func (r *replFlags) credentials() (natsauth.Config, error) {
	a := r.auth
	if a.Password == "" && a.User != "" {
		a.Password = os.Getenv(envNATSPassword)
	}
	if a.Token == "" && a.User == "" {
		a.Token = os.Getenv(envNATSToken)
	}
	named := os.Getenv(envNATSNKey) != ""
	r.fs.Visit(func(f *flag.Flag) { named = named || f.Name == "nkey" })
	if !named {
		other := a
		other.NKeySeedFile = ""
		if other.CredsFile != "" || other.User != "" || other.Token != "" {
			a.NKeySeedFile = ""
		} else if _, err := os.Stat(a.NKeySeedFile); err != nil {
			a.NKeySeedFile = ""
		}
	}
	if err := a.Validate(); err != nil {
		return a, err
	}
	return a, nil
}

// connect opens the NATS connection: the first connect must succeed (a
// wrong URL or missing credentials are reported at once); later losses
// reconnect forever.
func (r *replFlags) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	if err := r.layout().Validate(); err != nil {
		return nil, nil, err
	}
	auth, err := r.credentials()
	if err != nil {
		return nil, nil, err
	}
	aopts, err := auth.Options()
	if err != nil {
		return nil, nil, err
	}
	opts := append([]nats.Option{nats.Name("sbxctl-" + name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}, aopts...)
	nc, err := nats.Connect(r.url, opts...)
	if err != nil {
		err = fmt.Errorf("connect to NATS at %s (%s): %w", replicator.RedactURL(r.url), auth.Describe(), err)
		if errors.Is(err, nats.ErrAuthorization) && auth.IsZero() {
			err = fmt.Errorf("%w\nhint: no NATS credentials given: a sandboxd with the embedded server writes them to <data>/nats.nk; run sbxctl where %s exists, or pass --nkey (or $%s)", err, defaultNKey, envNATSNKey)
		}
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// consume runs a consumer until ctx ends, it fails, or (with --once) it
// has caught up with the stream's end as found at start: each node's
// position (what the consumer's output holds) reached its last event, or
// the durable consumer acknowledged the last message of them all (usage
// writes no record for some events, so its position can stay below the
// end). It returns the ends it waited for (nil without --once).
func (r *replFlags) consume(ctx context.Context, js jetstream.JetStream, nodes []string, c consumer) (map[string]stream.End, error) {
	var ends map[string]stream.End
	var endStreamSeq uint64
	if r.once {
		var err error
		if ends, err = r.layout().Ends(ctx, js, nodes); err != nil {
			return nil, err
		}
		for _, e := range ends {
			endStreamSeq = max(endStreamSeq, e.StreamSeq)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	if !r.once {
		return nil, <-done
	}
	// The durable consumer's acknowledged floor speaks for the output only
	// once the feed has checked it against the output (a durable left by
	// an earlier output is rebuilt), and only for a handler whose position
	// can lag (usage); the others' positions say it all.
	select {
	case <-c.Attached():
	case err := <-done:
		return ends, err
	}
	acked := func() bool {
		if !c.lags {
			return false
		}
		ictx, icancel := context.WithTimeout(ctx, 5*time.Second)
		defer icancel()
		c, err := js.Consumer(ictx, r.stream, r.durable)
		if err != nil {
			return false
		}
		info, err := c.Info(ictx)
		return err == nil && info.AckFloor.Stream >= endStreamSeq
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		reached := true
		for n, end := range ends {
			reached = reached && c.Position(n) >= end.Seq
		}
		if reached || acked() {
			cancel()
			return ends, <-done
		}
		select {
		case err := <-done:
			return ends, err
		case <-tick.C:
		}
	}
}

// consumer is a running consumer as consume sees it: its run, when its
// consumer is in place, its output's positions and whether they can lag.
type consumer struct {
	Run      func(context.Context) error
	Attached func() <-chan struct{}
	Position func(node string) uint64
	lags     bool
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(baseContext(), os.Interrupt, syscall.SIGTERM)
}

func replFollow(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sbxctl follow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var rf replFlags
	rf.add(fs, "default follower-<node>; followers of one node on different hosts need different names")
	node := fs.String("node", "", "the node whose log to follow (required)")
	data := fs.String("data", "", "the replica's op log directory, created if missing (required; sbxctl log/replay read it)")
	if code := parseRepl(fs, "follow", args, stderr); code >= 0 {
		return code
	}
	switch {
	case *node == "":
		fmt.Fprintln(stderr, "sbxctl follow: --node is required")
		return 2
	case *data == "":
		fmt.Fprintln(stderr, "sbxctl follow: --data is required")
		return 2
	}
	if err := stream.CheckNodeID(*node); err != nil {
		fmt.Fprintf(stderr, "sbxctl follow: --node: %v\n", err)
		return 2
	}
	if err := rf.layout().Validate(); err != nil {
		fmt.Fprintf(stderr, "sbxctl follow: %v\n", err)
		return 2
	}
	zl, err := rf.logger(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sbxctl follow: %v\n", err)
		return 2
	}
	nc, js, err := rf.connect("follow")
	if err != nil {
		fmt.Fprintf(stderr, "sbxctl follow: %v\n", err)
		return 1
	}
	defer nc.Close()
	replica, err := eventlog.Open(*data, eventlog.Options{NodeID: *node, Logger: zl})
	if err != nil {
		fmt.Fprintf(stderr, "sbxctl follow: replica: %v\n", err)
		return 1
	}
	defer replica.Close()
	if rf.durable == "" {
		rf.durable = "follower-" + stream.Token(*node)
	}
	sctx, scancel := context.WithTimeout(baseContext(), 10*time.Second)
	err = rf.followable(sctx, js, *node, replica.LastSeq())
	scancel()
	if err != nil {
		fmt.Fprintf(stderr, "sbxctl follow: %v\n", err)
		return 1
	}
	f, err := follower.New(follower.Options{JS: js, Stream: rf.stream, SubjectPrefix: rf.prefix, Replica: replica, Durable: rf.durable, Logger: zl})
	if err != nil {
		fmt.Fprintf(stderr, "sbxctl follow: %v\n", err)
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	_, err = rf.consume(ctx, js, []string{*node}, consumer{Run: f.Run, Attached: f.Attached, Position: func(string) uint64 { return f.LastSeq() }})
	fmt.Fprintf(stdout, "replica of %s in %s: events %d..%d\n", *node, *data, replica.FirstSeq(), replica.LastSeq())
	if err != nil {
		fmt.Fprintf(stderr, "sbxctl follow: %v\n", err)
		return 1
	}
	return 0
}

// followable refuses to follow node into a replica that holds up to last
// when the stream cannot continue it: the node's first event in the stream
// is past last+1, or the stream holds none of the node's events while it
// has lost messages from its head (into an empty replica: the node's
// events may be among them). A replica holds the log from event 1 without
// holes, so both would end in an empty or broken replica (issue 22).
func (r *replFlags) followable(ctx context.Context, js jetstream.JetStream, node string, last uint64) error {
	s, err := r.layout().Start(ctx, js, node)
	if err != nil {
		return err
	}
	const why = "an age or size limit of the stream (max_age, max_msgs, max_bytes) or a purge removed them"
	const fix = "copy the node's data dir (or a replica) to --data and follow from there, or follow from a stream that kept them"
	switch {
	case s.Seq > last+1:
		return fmt.Errorf("node %s's first event in stream %s is %d (stream seq %d): events %d..%d are no longer in the stream (%s), and a replica holds the log without holes: %s",
			node, r.stream, s.Seq, s.StreamSeq, last+1, s.Seq-1, why, fix)
	case s.Seq == 0 && last == 0 && s.Removed > 0:
		return fmt.Errorf("stream %s holds no event of node %s, and its messages up to stream seq %d are gone (%s): if %s published events they left the stream, and a replica from it would be empty: %s",
			r.stream, node, s.Removed, why, node, fix)
	}
	return nil
}

// journalConsumer is what usage and audit have in common.
type journalConsumer interface {
	feed.Handler
	Close() error
}

var (
	_ journalConsumer = (*usagejournal.Consumer)(nil)
	_ journalConsumer = (*audit.Consumer)(nil)
)

// replJournal builds `sbxctl usage` or `sbxctl audit`.
func replJournal(kind string) func(args []string, stdout, stderr io.Writer) int {
	return func(args []string, stdout, stderr io.Writer) int {
		name := kind
		fs := flag.NewFlagSet("sbxctl "+name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		var rf replFlags
		rf.add(fs, "default sbxctl-"+name+"; keep it across runs, so each run resumes where the last one stopped")
		out := fs.String("out", "", "the journal file ("+name+".jsonl), appended to and resumed from (required)")
		nodesFlag := fs.String("nodes", "", "comma-separated node ids to consume (default: every node)")
		if code := parseRepl(fs, name, args, stderr); code >= 0 {
			return code
		}
		if *out == "" {
			fmt.Fprintf(stderr, "sbxctl %s: --out is required\n", name)
			return 2
		}
		if rf.durable == "" {
			rf.durable = "sbxctl-" + name
		}
		var nodes []string
		if *nodesFlag != "" {
			nodes = strings.Split(*nodesFlag, ",")
			for _, n := range nodes {
				if err := stream.CheckNodeID(n); err != nil {
					fmt.Fprintf(stderr, "sbxctl %s: --nodes: %v\n", name, err)
					return 2
				}
			}
		}
		zl, err := rf.logger(stderr)
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl %s: %v\n", name, err)
			return 2
		}
		nc, js, err := rf.connect(name)
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl %s: %v\n", name, err)
			return 1
		}
		defer nc.Close()
		var c journalConsumer
		if kind == "usage" {
			c, err = usagejournal.Open(*out, usagejournal.Options{})
		} else {
			c, err = audit.Open(*out)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl %s: %v\n", name, err)
			return 1
		}
		f, err := feed.New(feed.Options{JS: js, Stream: rf.stream, SubjectPrefix: rf.prefix, Durable: rf.durable, Nodes: nodes, Logger: zl}, c)
		if err != nil {
			_ = c.Close()
			fmt.Fprintf(stderr, "sbxctl %s: %v\n", name, err)
			return 2
		}
		ctx, stop := signalContext()
		defer stop()
		l, lags := c.(feed.Lagging)
		lags = lags && l.PositionLags()
		ends, err := rf.consume(ctx, js, nodes, consumer{Run: f.Run, Attached: f.Attached, Position: c.Position, lags: lags})
		// Report every node this run knew of: asked for, at the stream's
		// end, or delivered.
		seen := map[string]bool{}
		for _, n := range nodes {
			seen[n] = true
		}
		for n := range ends {
			seen[n] = true
		}
		fed := f.Status().Positions
		for n := range fed {
			seen[n] = true
		}
		// The feed's position where it delivered this run: usage's own
		// stops at the last event that made a record.
		parts := []string{}
		for _, n := range slices.Sorted(maps.Keys(seen)) {
			parts = append(parts, fmt.Sprintf("%s at %d", n, max(c.Position(n), fed[n])))
		}
		if cerr := c.Close(); err == nil {
			err = cerr
		}
		fmt.Fprintf(stdout, "%s: %s\n", *out, strings.Join(parts, ", "))
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl %s: %v\n", name, err)
			return 1
		}
		return 0
	}
}
