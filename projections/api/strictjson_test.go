package api

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The strict check stays linear in the number of keys and bounded in
// depth, whatever a caller sends (it runs before a handler has looked at
// much else), and still finds a duplicate far into a big object.
func TestStrictJSONCostIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"metadata":{`)
	for i := range 80000 {
		fmt.Fprintf(&b, `"k%d":"v",`, i)
	}
	b.WriteString(`"k79999":"again"}}`)
	start := time.Now()
	err := checkStrictJSON([]byte(b.String()), reflect.TypeOf(&ClaimRequest{}))
	if err == nil || !strings.Contains(err.Error(), "duplicate field") {
		t.Fatalf("80k keys with a late duplicate: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("80k keys took %s: not linear", d)
	}
	deep := strings.Repeat("[", 1<<20)
	if err := checkStrictJSON([]byte(deep), reflect.TypeOf(&ClaimRequest{})); err != nil {
		t.Fatalf("a deep array is the decoder's to refuse: %v", err)
	}
}

// Keys are compared as the decoder sees them: invalid UTF-8 is U+FFFD to
// it, so keys that differ only there are one key, kept last.
func TestStrictJSONInvalidUTF8Keys(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		dup        bool
	}{
		{"two invalid bytes", "{\"metadata\":{\"a\xff\":\"1\",\"a\xfe\":\"2\"}}", true},
		{"an invalid byte and its replacement, escaped", "{\"metadata\":{\"a\xff\":\"1\",\"a\\ufffd\":\"2\"}}", true},
		{"an invalid byte and its replacement, raw", "{\"metadata\":{\"a\xff\":\"1\",\"a\uFFFD\":\"2\"}}", true},
		{"different keys", "{\"metadata\":{\"a\xff\":\"1\",\"b\xff\":\"2\"}}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkStrictJSON([]byte(tc.body), reflect.TypeOf(&ClaimRequest{}))
			if got := err != nil && strings.Contains(err.Error(), "duplicate field"); got != tc.dup {
				t.Fatalf("%q: %v, want duplicate %v", tc.body, err, tc.dup)
			}
		})
	}
}
