package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sbxlog/sbxlog/executors/guest/silkagent"
	"github.com/sbxlog/sbxlog/executors/guest/silkd"
	"github.com/sbxlog/sbxlog/projections/apiclient"
)

// push and pull move a whole directory through the agent's fs_push and
// fs_pull as a tar stream, made and extracted here by the agent's own tar
// code (silkagent.WriteTar, silkagent.ExtractInto) on the local tree, so
// both ends refuse the same escapes and keep the same bounds.

func init() {
	register("push", command{summary: "copy a local directory's contents into a sandbox directory (as a tar stream)", examples: `sbxctl push sb_0123456789abcdef ./src /work/src`, run: remoteCommand(remoteSpec{
		name: "push", args: []string{"ID", "LOCAL_DIR", "GUEST_DIR"}, stream: true, noJSON: true, flags: pushFlags})})
	register("pull", command{summary: "copy a sandbox file or directory into a local directory (as a tar stream)", examples: `sbxctl pull sb_0123456789abcdef /work/out ./out`, run: remoteCommand(remoteSpec{
		name: "pull", args: []string{"ID", "GUEST_PATH", "LOCAL_DIR"}, stream: true, noJSON: true, flags: pullFlags})})
}

func pushFlags(fs *flag.FlagSet) remoteBody {
	sandbox := sandboxTokenFlag(fs)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		id, local, dest := cl.args[0], cl.args[1], cl.args[2]
		if st, err := os.Stat(local); err != nil {
			return err
		} else if !st.IsDir() {
			return usagef("%s is not a directory: push copies a directory's contents (cp copies a file)", local)
		}
		conn, err := dialAgent(ctx, sandbox, c, id)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = pushTree(ctx, conn, local, dest)
		return err
	}
}

// pushTree sends local's contents into guest directory dest as a tar
// stream and returns the stream's size.
func pushTree(ctx context.Context, conn *silkd.Conn, local, dest string) (int64, error) {
	pr, pw := io.Pipe()
	cw := &countingWriter{w: pw}
	go func() {
		pw.CloseWithError(silkagent.WriteTar(silkagent.OSFS{}, local, "", cw, silkagent.Limits{}))
	}()
	defer pr.Close()
	err := conn.Push(ctx, dest, pr)
	return cw.n, err
}

// countingWriter counts what goes through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

func pullFlags(fs *flag.FlagSet) remoteBody {
	sandbox := sandboxTokenFlag(fs)
	return func(ctx context.Context, c *apiclient.Client, cl *call) error {
		id, p, local := cl.args[0], cl.args[1], cl.args[2]
		conn, err := dialAgent(ctx, sandbox, c, id)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = pullTree(ctx, conn, p, local)
		return err
	}
}

// pullTree extracts guest path p (a file or a tree, under its base name)
// into local directory local and returns the tar stream's size.
func pullTree(ctx context.Context, conn *silkd.Conn, p, local string) (int64, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := silkagent.ExtractInto(silkagent.OSFS{}, local, pr, silkagent.Limits{})
		pr.CloseWithError(err)
		done <- err
	}()
	n, err := conn.Pull(ctx, p, pw)
	pw.CloseWithError(err)
	if xerr := <-done; err == nil && xerr != nil {
		return n, fmt.Errorf("extracting into %s: %w", local, xerr)
	}
	return n, err
}

// dialAgent connects to sandbox id's agent with the sandbox's own token.
func dialAgent(ctx context.Context, sandbox func(*apiclient.Client) (*apiclient.Client, error), c *apiclient.Client, id string) (*silkd.Conn, error) {
	sc, err := sandbox(c)
	if err != nil {
		return nil, err
	}
	nc, err := sc.DialAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	return silkd.NewConn(nc), nil
}
