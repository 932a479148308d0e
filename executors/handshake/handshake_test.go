package handshake

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadLine(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		max      int
		want     string
		err      error
		rest     string
	}{
		{name: "line", in: "OK 5\nframe", max: 8, want: "OK 5", rest: "frame"},
		{name: "empty line", in: "\nx", max: 8, want: "", rest: "x"},
		{name: "exactly max", in: "12345678\n", max: 8, want: "12345678"},
		{name: "cr kept", in: "OK\r\n", max: 8, want: "OK\r"},
		// The byte past the bound is read (it is how the bound is seen) and dropped.
		{name: "too long", in: "123456789\n", max: 8, want: "12345678", err: ErrLineTooLong, rest: "\n"},
		{name: "eof", in: "OK", max: 8, want: "OK", err: io.EOF},
		{name: "nothing", in: "", max: 8, want: "", err: io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := strings.NewReader(tc.in)
			// OneByteReader returns data and errors in separate calls, as
			// sockets may; the plain reader returns EOF after the last byte.
			for _, rd := range []io.Reader{r, iotest.OneByteReader(r)} {
				r.Reset(tc.in)
				got, err := ReadLine(rd, tc.max)
				if string(got) != tc.want || !errors.Is(err, tc.err) {
					t.Fatalf("ReadLine(%q, %d) = %q, %v; want %q, %v", tc.in, tc.max, got, err, tc.want, tc.err)
				}
				if rest, _ := io.ReadAll(r); string(rest) != tc.rest {
					t.Fatalf("left %q unread, want %q", rest, tc.rest)
				}
			}
		})
	}
}

// An error that arrives with the last byte still returns that byte.
func TestReadLineDataWithError(t *testing.T) {
	got, err := ReadLine(iotest.DataErrReader(strings.NewReader("OK")), 8)
	if string(got) != "OK" || !errors.Is(err, io.EOF) {
		t.Fatalf("ReadLine = %q, %v", got, err)
	}
}
