package eventlog

import (
	"errors"
	"strings"
	"testing"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

// TestVerifyFindsDamage damages a healthy log through Pebble directly and
// checks Verify (and readers) name the first bad sequence.
func TestVerifyFindsDamage(t *testing.T) {
	// Ops of 3 events: op n holds seqs 3n-2..3n, for n = 1..4.
	record := func(t *testing.T, dir string, seq uint64) []byte {
		l := openTest(t, dir, Options{ReadOnly: true})
		defer l.Close()
		evs, err := l.Read(seq, 1)
		if err != nil {
			t.Fatal(err)
		}
		return event.Encode(&evs[0])
	}
	tests := []struct {
		name    string
		damage  func(t *testing.T, dir string) [][]byte
		badSeq  uint64
		message string
		readErr bool // Read over the range fails too
	}{
		{"flipped byte", func(t *testing.T, dir string) [][]byte {
			rec := record(t, dir, 5)
			rec[len(rec)-2] ^= 0x40
			return [][]byte{EventKey(5), rec}
		}, 5, "checksum", true},
		{"record under another seq", func(t *testing.T, dir string) [][]byte {
			return [][]byte{EventKey(7), record(t, dir, 8)}
		}, 7, "carries seq 8", true},
		{"missing record in the middle of an op", func(t *testing.T, dir string) [][]byte {
			return [][]byte{EventKey(8), nil}
		}, 8, "missing record", true},
		{"last event of the last op missing", func(t *testing.T, dir string) [][]byte {
			return [][]byte{EventKey(12), nil}
		}, 12, "partial", false},
		{"one op id in two places", func(t *testing.T, dir string) [][]byte {
			var kvs [][]byte
			for seq := uint64(7); seq <= 9; seq++ {
				l := openTest(t, dir, Options{ReadOnly: true})
				evs, err := l.Read(seq, 1)
				if err != nil {
					t.Fatal(err)
				}
				_ = l.Close()
				evs[0].OpID = testOp(1)
				kvs = append(kvs, EventKey(seq), event.Encode(&evs[0]))
			}
			return kvs
		}, 7, "appears twice", false},
		{"op index entry missing", func(t *testing.T, dir string) [][]byte {
			return [][]byte{opKey(testOp(3)), nil}
		}, 7, "no op-index entry", false},
		{"op index entry pointing past the end", func(t *testing.T, dir string) [][]byte {
			return [][]byte{opKey(testOp(99)), []byte("\x00\x00\x00\x00\x00\x00\x00\x20\x00\x00\x00\x01")}
		}, 13, "points at 32..32", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openTest(t, dir, Options{})
			for n := uint64(1); n <= 4; n++ {
				mustAppend(t, l, mkEvents(testOp(n), 3, "v"))
			}
			mustVerify(t, l)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			rawSet(t, dir, tc.damage(t, dir)...)

			l = openTest(t, dir, Options{ReadOnly: true})
			_, err := l.Verify()
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Seq != tc.badSeq || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("Verify: %v; want *CorruptError at seq %d mentioning %q", err, tc.badSeq, tc.message)
			}
			if _, err := l.Read(1, 0); tc.readErr != (err != nil) {
				t.Fatalf("Read over the damage: %v, want error %v", err, tc.readErr)
			}
		})
	}
}
