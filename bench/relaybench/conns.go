package relaybench

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// connectOnce times a fresh connection up to its first echoed byte.
func connectOnce(ctx context.Context, dial func(context.Context) (net.Conn, error)) (time.Duration, error) {
	start := time.Now()
	c, err := dial(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'x'}); err != nil {
		return 0, err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func gibps(bps float64) string { return fmt.Sprintf("%.2f GiB/s", bps/(1<<30)) }
