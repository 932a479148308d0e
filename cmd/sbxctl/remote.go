package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// Where the commands that talk to sandboxd find it and their token:
// --addr, else $SBX_ADDR, else the default listen address; --token, else
// $SBX_API_TOKEN, else the first line of --token-file (default
// $SBX_API_TOKEN_FILE, else data/api.token: the root token sandboxd writes
// on a first start with its built-in defaults, as `make run` does).
const (
	envAddr      = "SBX_ADDR"
	envToken     = "SBX_API_TOKEN"
	envTokenFile = "SBX_API_TOKEN_FILE"
	// defaultTokenFile is relative to the working directory: `make run`
	// starts sandboxd with data dir ./data at the repository's root.
	defaultTokenFile = "data/api.token"
)

// baseContext is the context remote commands start from (tests replace it
// to stop a --follow).
var baseContext = context.Background

// call is what a remote command's body gets.
type call struct {
	args   []string // positional arguments
	json   bool
	stdout io.Writer
	stderr io.Writer
}

// usageError is bad usage found after flag parsing: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// exitCode is a body's way to exit with a code of its own (exec passes on
// its command's).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// remoteBody runs a command against a client. ctx carries --timeout (none
// for streams) and ends on SIGINT/SIGTERM.
type remoteBody func(ctx context.Context, c *apiclient.Client, cl *call) error

// remoteSpec describes a command that talks to sandboxd.
type remoteSpec struct {
	name string
	// args names the positional arguments, for usage; exactly that many are
	// required, unless rest names more that may follow.
	args []string
	rest string
	// stream commands get no --timeout (they run until stopped).
	stream bool
	// noJSON: the command prints no API answer, so it has no --json.
	noJSON bool
	// flags defines the command's own flags and returns its body.
	flags func(fs *flag.FlagSet) remoteBody
}

// remoteCommand builds the run function of a remote command. Flags may come
// before or after the positional arguments ("release ID --json").
func remoteCommand(spec remoteSpec) func(args []string, stdout, stderr io.Writer) int {
	return func(args []string, stdout, stderr io.Writer) int {
		fs := flag.NewFlagSet("sbxctl "+spec.name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		usageLine := "usage: sbxctl " + spec.name
		for _, a := range spec.args {
			usageLine += " " + a
		}
		if spec.rest != "" {
			usageLine += " " + spec.rest
		}
		fs.Usage = func() {
			fmt.Fprintln(stderr, usageLine+" [flags]")
			fs.PrintDefaults()
		}
		addr := fs.String("addr", envOr(envAddr, apiclient.DefaultAddr), "sandboxd address ($"+envAddr+")")
		token := fs.String("token", "", "API token (default $"+envToken+", else the first line of --token-file)")
		tokenFile := fs.String("token-file", envOr(envTokenFile, defaultTokenFile), "file holding the token, read when --token and $"+envToken+" are unset ($"+envTokenFile+")")
		asJSON := new(bool)
		if !spec.noJSON {
			fs.BoolVar(asJSON, "json", false, "print the API's JSON instead of a table")
		}
		var timeout *time.Duration
		if !spec.stream {
			timeout = fs.Duration("timeout", 3*time.Minute, "give up on the call after this long")
		}
		body := spec.flags(fs)
		pos, err := parseInterleaved(fs, args)
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if len(pos) != len(spec.args) && (spec.rest == "" || len(pos) < len(spec.args)) {
			fmt.Fprintf(stderr, "sbxctl %s: want %d argument(s) %s, got %d\n", spec.name, len(spec.args), strings.Join(spec.args, " "), len(pos))
			fs.Usage()
			return 2
		}
		tok, explicitFile, err := resolveToken(*token, *tokenFile, fs)
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl %s: %v\n", spec.name, err)
			return 2
		}
		c, err := apiclient.New(*addr, tok, nil)
		if err != nil {
			fmt.Fprintf(stderr, "sbxctl %s: %v\n", spec.name, err)
			return 2
		}
		ctx, stop := signal.NotifyContext(baseContext(), os.Interrupt)
		defer stop()
		if timeout != nil && *timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, *timeout)
			defer cancel()
		}
		err = body(ctx, c, &call{args: pos, json: *asJSON, stdout: stdout, stderr: stderr})
		var ue *usageError
		var ec exitCode
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ec):
			return int(ec)
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "sbxctl %s: %v\n", spec.name, err)
			fs.Usage()
			return 2
		}
		fmt.Fprintf(stderr, "sbxctl %s: %v\n", spec.name, err)
		if errors.Is(err, syscall.ECONNREFUSED) {
			fmt.Fprintf(stderr, "hint: is sandboxd running at %s? (make run starts it; --addr or $%s names another)\n", c.Addr(), envAddr)
		}
		if apiclient.StatusOf(err) == 401 && tok == "" && !explicitFile {
			fmt.Fprintf(stderr, "hint: no token given: set $%s or --token (sandboxd started with its built-in defaults writes its root token to <data>/api.token; %s is read from the current directory)\n", envToken, defaultTokenFile)
		}
		return 1
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// resolveToken picks the token: --token, $SBX_API_TOKEN, then the token
// file. A missing default file means no token; a named one must exist.
func resolveToken(flagToken, file string, fs *flag.FlagSet) (tok string, explicitFile bool, err error) {
	if flagToken != "" {
		return flagToken, false, nil
	}
	if v := os.Getenv(envToken); v != "" {
		return v, false, nil
	}
	explicitFile = os.Getenv(envTokenFile) != ""
	fs.Visit(func(f *flag.Flag) { explicitFile = explicitFile || f.Name == "token-file" })
	data, err := os.ReadFile(file)
	if err != nil {
		if !explicitFile && errors.Is(err, os.ErrNotExist) {
			return "", false, nil
		}
		return "", explicitFile, fmt.Errorf("token file: %w", err)
	}
	tok, _, _ = strings.Cut(string(data), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", explicitFile, fmt.Errorf("token file %s is empty", file)
	}
	return tok, explicitFile, nil
}

// parseInterleaved parses flags wherever they appear among the positional
// arguments; "--" ends flag parsing.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at the first non-flag, or after "--".
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printTable prints v as indented JSON with --json, else as a table:
// header, then the lines rows writes (columns separated by tabs).
func printTable(cl *call, v any, header string, rows func(tw io.Writer)) error {
	if cl.json {
		return printJSON(cl.stdout, v)
	}
	tw := newTable(cl.stdout, header)
	rows(tw)
	return tw.Flush()
}

// newTable is the commands' table writer on w, header written.
func newTable(w io.Writer, header string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	return tw
}

// kvFlag is a repeatable key=value flag.
type kvFlag struct {
	keys []string
	m    map[string]string
}

func (f *kvFlag) String() string {
	parts := make([]string, len(f.keys))
	for i, k := range f.keys {
		parts[i] = k + "=" + f.m[k]
	}
	return strings.Join(parts, ",")
}

func (f *kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want key=value", s)
	}
	if f.m == nil {
		f.m = map[string]string{}
	}
	if _, dup := f.m[k]; !dup {
		f.keys = append(f.keys, k)
	}
	f.m[k] = v
	return nil
}

// secondsFlag takes a duration ("10m", "1h30m") or a plain number of
// seconds ("600") and holds whole seconds.
type secondsFlag struct {
	n   int64
	set bool
}

func (f *secondsFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.FormatInt(f.n, 10) + "s"
}

func (f *secondsFlag) Set(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		f.n, f.set = n, true
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q: want a duration (10m) or seconds (600)", s)
	}
	if d%time.Second != 0 {
		return fmt.Errorf("%q: want whole seconds", s)
	}
	f.n, f.set = int64(d/time.Second), true
	return nil
}

// shortTime renders an RFC 3339 time to the second for tables.
func shortTime(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return s
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// readFileArg reads a file named by a flag; "-" reads stdin.
func readFileArg(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(stdin)
	}
	return os.ReadFile(path)
}

// decodeFileArg strictly decodes the JSON file named by a flag into v.
func decodeFileArg(path string, v any) error {
	data, err := readFileArg(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
