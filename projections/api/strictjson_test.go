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
