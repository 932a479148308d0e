package event

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files (only for a NEW type or version; never for an existing one)")

func sampleEnvelope() Event {
	return Event{
		Seq: 42, Node: "node-a", Time: 1_790_000_000_123_456_789,
		Type: TypeClaimCreated, Version: 1, AggKind: AggClaim, AggID: "sb_00112233445566ff",
		OpID: OpIDFromUint(1_790_000_000_123, 7), Causation: OpIDFromUint(1_790_000_000_000, 1),
		Payload: []byte(`{"k":"v"}`),
	}
}

func TestCodecRoundTrip(t *testing.T) {
	for _, e := range []Event{
		sampleEnvelope(),
		{Seq: 1, Type: TypePoolsConfigured, Version: 1, AggKind: AggNode, AggID: "n"},
		{Seq: 1 << 62, Time: -5, Type: TypeWoken, Version: 1, AggKind: AggClaim, AggID: strings.Repeat("x", 300), Payload: bytes.Repeat([]byte{0}, 70000)},
	} {
		got, err := Decode(Encode(&e))
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if got.Seq != e.Seq || got.Node != e.Node || got.Time != e.Time || got.Type != e.Type ||
			got.Version != e.Version || got.AggKind != e.AggKind || got.AggID != e.AggID ||
			got.OpID != e.OpID || got.Causation != e.Causation || !bytes.Equal(got.Payload, e.Payload) {
			t.Fatalf("round trip mismatch:\n got %+v\nwant %+v", got, e)
		}
		if s, err := PeekSeq(Encode(&e)); err != nil || s != e.Seq {
			t.Fatalf("PeekSeq = %d, %v; want %d", s, err, e.Seq)
		}
	}
}

// Every single-byte corruption and every truncation must be detected.
func TestCodecDetectsCorruption(t *testing.T) {
	e := sampleEnvelope()
	rec := Encode(&e)
	for i := range rec {
		bad := append([]byte(nil), rec...)
		bad[i] ^= 0x5a
		if _, err := Decode(bad); err == nil {
			t.Fatalf("flip at byte %d not detected", i)
		}
	}
	for n := 0; n < len(rec); n++ {
		if _, err := Decode(rec[:n]); err == nil {
			t.Fatalf("truncation to %d bytes not detected", n)
		}
	}
}

func TestCodecRefusesNewerFormat(t *testing.T) {
	e := sampleEnvelope()
	rec := Encode(&e)
	rec[4] = FormatCurrent + 1
	// Re-seal the checksum so only the format byte is wrong.
	rec = reseal(rec)
	_, err := Decode(rec)
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("err = %v, want ErrFormat naming format 2", err)
	}
}

func reseal(rec []byte) []byte {
	out := append([]byte(nil), rec...)
	binary.LittleEndian.PutUint32(out, crc32.Checksum(out[4:], castagnoli))
	return out
}

func TestValidate(t *testing.T) {
	ok := sampleEnvelope()
	cases := []struct {
		name string
		mut  func(*Event)
		want error
	}{
		{"ok", func(*Event) {}, nil},
		{"unknown type", func(e *Event) { e.Type = 9999 }, ErrUnknownType},
		{"zero type", func(e *Event) { e.Type = TypeInvalid }, ErrUnknownType},
		{"future version", func(e *Event) { e.Version = 99 }, ErrUnknownType},
		{"wrong aggregate", func(e *Event) { e.AggKind = AggVM }, ErrBadAggregate},
		{"empty aggregate", func(e *Event) { e.AggID = "" }, ErrEmptyAggregate},
		{"no op id", func(e *Event) { e.OpID = ZeroOpID }, ErrMissingOpID},
		{"payload over 1 MiB", func(e *Event) { e.Payload = make([]byte, MaxPayload+1) }, ErrPayloadTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := ok
			tc.mut(&e)
			err := e.Validate()
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Validate() = %v, want %v", err, tc.want)
			}
			var ie *InvalidError
			if tc.want != nil && !errors.As(err, &ie) {
				t.Fatalf("error %T is not *InvalidError", err)
			}
		})
	}
}

func TestDeriveOpIDDeterministic(t *testing.T) {
	p := OpIDFromUint(1000, 1)
	a, b := DeriveOpID(p, "result"), DeriveOpID(p, "result")
	if a != b {
		t.Fatal("derivation not deterministic")
	}
	if a == DeriveOpID(p, "other") || a == p {
		t.Fatal("derived ids collide")
	}
	if a.Time() != p.Time() {
		t.Fatalf("derived id lost the parent's timestamp: %d vs %d", a.Time(), p.Time())
	}
}

// Type numbers and names are append-only: this table is the record of every
// number ever assigned. Changing a line fails; a new type adds one.
func TestTypeRegistryIsAppendOnly(t *testing.T) {
	golden := filepath.Join("testdata", "types.txt")
	var b strings.Builder
	for _, ty := range Types() {
		b.WriteString(strings.Join([]string{strconv.Itoa(int(ty)), ty.String(), "v" + strconv.Itoa(int(ty.Version())), ty.Aggregate().String()}, " ") + "\n")
	}
	got := b.String()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read %s (run with -update once to create it): %v", golden, err)
	}
	// Every pinned line must still be present verbatim, except that a type's
	// current version may go up (its older decoders stay, see payload tests).
	for _, line := range strings.Split(strings.TrimSpace(string(want)), "\n") {
		f := strings.Fields(line)
		found := false
		for _, gl := range strings.Split(got, "\n") {
			g := strings.Fields(gl)
			if len(g) == 4 && g[0] == f[0] && g[1] == f[1] && g[3] == f[3] && version(g[2]) >= version(f[2]) {
				found = true
			}
		}
		if !found {
			t.Errorf("pinned type %q was renumbered, renamed or removed", line)
		}
	}
}

// The envelope encoding is pinned byte for byte.
func TestEnvelopeGolden(t *testing.T) {
	e := sampleEnvelope()
	checkGolden(t, filepath.Join("testdata", "envelope_v1.bin"), Encode(&e))
	want, _ := os.ReadFile(filepath.Join("testdata", "envelope_v1.bin"))
	got, err := Decode(want)
	if err != nil || got.AggID != e.AggID || got.Seq != e.Seq {
		t.Fatalf("golden record no longer decodes: %v %+v", err, got)
	}
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if _, err := os.Stat(path); err == nil {
			t.Logf("%s exists; -update does not rewrite a pinned encoding", path)
		} else if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden %s (run with -update once to create it): %v", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encoding of %s changed:\n got %x\nwant %x", path, got, want)
	}
}

func version(s string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(s, "v"))
	return n
}
