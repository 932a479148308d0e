package qemu

import (
	"errors"
	"testing"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/fsm"
)

// What exists is what the template table (Config.Templates) names: any
// other template, and any egress key, is refused before anything is
// proposed (a claim of "nope" used to boot the guest and leave a phantom
// pool behind), and the boots refuse them too.
func TestCheckPool(t *testing.T) {
	for _, tc := range []struct {
		name      string
		templates map[string]Guest
		key       fsm.PoolKey
		want      error
	}{
		{"default template", map[string]Guest{"default": {}}, fsm.PoolKey{Template: "default", Net: "none", Size: "small"}, nil},
		{"unknown template", map[string]Guest{"default": {}}, fsm.PoolKey{Template: "nope", Net: "none", Size: "small"}, executors.ErrUnknownTemplate},
		{"egress", map[string]Guest{"default": {}}, fsm.PoolKey{Template: "default", Net: "egress", Size: "small"}, executors.ErrNetUnsupported},
		{"configured template", map[string]Guest{"py": {}, "go": {}}, fsm.PoolKey{Template: "go", Net: "none", Size: "large"}, nil},
		{"default is always served", map[string]Guest{"py": {}}, fsm.PoolKey{Template: "default", Net: "none", Size: "small"}, nil},
		{"no table", nil, fsm.PoolKey{Template: "py", Net: "none", Size: "small"}, executors.ErrUnknownTemplate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, t.TempDir(), func(c *Config) { c.Templates = tc.templates })
			for _, pooled := range []bool{false, true} {
				err := d.CheckPool(tc.key, pooled)
				if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
					t.Fatalf("CheckPool(%s, pooled %v) = %v, want %v", tc.key, pooled, err, tc.want)
				}
			}
			if tc.want == nil {
				return
			}
			// A boot of such a key fails for good, whatever reached it.
			_, err := d.bootSpec(t.Context(), "run", "store", tc.key)
			if !errors.Is(err, tc.want) || !executors.IsUnrecoverable(err) {
				t.Fatalf("bootSpec(%s) = %v, want an unrecoverable %v", tc.key, err, tc.want)
			}
		})
	}
	if _, err := New(Config{Roots: newDriver(t, t.TempDir(), nil).roots, Instance: testInstance, Templates: map[string]Guest{"../x": {}}}); err == nil {
		t.Fatal("New took a template name that is a path escape")
	}
}
