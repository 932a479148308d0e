package fsm

import (
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"

	"github.com/sbxlog/sbxlog/eventlog/event"
)

var (
	templateRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$`)
	nameRE     = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$`)
)

// Nets are the pool nets of the old daemon's API.
var Nets = []string{"none", "egress"}

// Size is a pool size: its name in pool keys and the vCPUs and memory a VM of
// that size gets.
type Size struct {
	Name      string
	VCPUs     int
	MemoryMiB int
}

// Sizes is the size table of the old daemon's API, smallest first, and the
// only place sizes are defined: ValidKey accepts exactly its names, and the
// drivers take a VM's vCPUs and memory from it (the Cloud Hypervisor driver
// as they are; the QEMU driver scales them down under TCG emulation).
var Sizes = []Size{
	{Name: "small", VCPUs: 1, MemoryMiB: 512},
	{Name: "medium", VCPUs: 2, MemoryMiB: 1 << 10},
	{Name: "large", VCPUs: 4, MemoryMiB: 4 << 10},
	{Name: "xlarge", VCPUs: 4, MemoryMiB: 8 << 10},
	{Name: "2xlarge", VCPUs: 8, MemoryMiB: 16 << 10},
}

// SizeNamed returns the row of Sizes called name.
func SizeNamed(name string) (Size, bool) {
	for _, z := range Sizes {
		if z.Name == name {
			return z, true
		}
	}
	return Size{}, false
}

// sizeNames lists the names of Sizes as a sentence: "a, b or c".
func sizeNames() string {
	var b strings.Builder
	for i, z := range Sizes {
		switch {
		case i == 0:
		case i == len(Sizes)-1:
			b.WriteString(" or ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(z.Name)
	}
	return b.String()
}

// ValidRelPath is the one rule for a name that becomes a path below a root
// of the data dir (a template name under templates/, run and snapshot dirs
// under their roots): relative, '/'-separated segments that are all
// non-empty, none "." or "..", and none hidden (a leading '.': the
// executors' temp dirs are dot-named). Such a name, joined to its root,
// is already clean and stays inside the root.
func ValidRelPath(p string) bool {
	if p == "" || p[0] == '/' {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "" || seg[0] == '.' {
			return false
		}
	}
	return true
}

// ValidKey checks a pool key's template name, net and size. A template
// name becomes a directory name (ValidRelPath).
func ValidKey(k PoolKey) error {
	if !templateRE.MatchString(k.Template) {
		return reject(Invalid, "invalid template name %q", k.Template)
	}
	if !ValidRelPath(k.Template) {
		return reject(Invalid, "invalid template name %q: each '/'-separated part must be non-empty and not start with '.'", k.Template)
	}
	if !contains(Nets, k.Net) {
		return reject(Invalid, "invalid net %q: want none or egress", k.Net)
	}
	if _, ok := SizeNamed(k.Size); !ok {
		return reject(Invalid, "invalid size %q: want %s", k.Size, sizeNames())
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ValidClaimID reports whether id is "sb_" followed by 16 lowercase hex digits.
func ValidClaimID(id string) bool { return prefixedHex16(id, "sb_") }

// prefixedHex16 reports whether id is prefix (3 bytes) and 16 lowercase hex
// digits: the form of the ids the API mints.
func prefixedHex16(id, prefix string) bool {
	if len(id) != 19 || id[:3] != prefix {
		return false
	}
	for _, c := range []byte(id[3:]) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// VMID returns the n-th VM id derived from op: "vm-" + 16 hex digits. Decide
// uses n = 0, 1, ... skipping ids already in use, so a decision's VM ids are
// a pure function of its op id and the state.
func VMID(op event.OpID, n int) string {
	d := event.DeriveOpID(op, "vm/"+strconv.Itoa(n))
	return "vm-" + hex.EncodeToString(d[8:16])
}

// IntentOp is the op id of the intent created by the request event of type t
// about aggregate aggID appended under op. It is derived rather than reused
// because one batch may create several intents (a refill's clones).
func IntentOp(op event.OpID, t event.Type, aggID string) event.OpID {
	return event.DeriveOpID(op, t.String()+"/"+aggID)
}

func checkText(field, v string, max int) error {
	if len(v) > max {
		return reject(Invalid, "%s is over %d bytes", field, max)
	}
	return nil
}

func checkMetadata(m map[string]string) error {
	if len(m) > MaxMetadataKeys {
		return reject(Invalid, "metadata has %d keys, at most %d", len(m), MaxMetadataKeys)
	}
	for _, k := range sortedKeys(m) {
		if k == "" || len(k) > MaxMetadataKey {
			return reject(Invalid, "metadata key %q: 1 to %d bytes", k, MaxMetadataKey)
		}
		if len(m[k]) > MaxMetadataValue {
			return reject(Invalid, "metadata value of %q is over %d bytes", k, MaxMetadataValue)
		}
	}
	return nil
}

// ttlSeconds applies the default and bounds of a lease.
func ttlSeconds(v int64) (int64, error) {
	switch {
	case v < 0:
		return 0, reject(Invalid, "ttl_seconds %d is negative", v)
	case v == 0:
		return DefaultTTLSeconds, nil
	case v > MaxTTLSeconds:
		return 0, reject(Invalid, "ttl_seconds %d is over the maximum %d", v, MaxTTLSeconds)
	}
	return v, nil
}

// normSpecs validates pool specs, fills WarmMax and sorts them by key.
func normSpecs(in []PoolSpec) ([]PoolSpec, error) {
	if len(in) > MaxPools {
		return nil, reject(Invalid, "%d pools, at most %d", len(in), MaxPools)
	}
	out := make([]PoolSpec, len(in))
	seen := make(map[PoolKey]bool, len(in))
	total := 0
	for i, p := range in {
		if err := ValidKey(p.PoolKey); err != nil {
			return nil, err
		}
		if seen[p.PoolKey] {
			return nil, reject(Invalid, "pool %s listed twice", p.PoolKey)
		}
		seen[p.PoolKey] = true
		switch {
		case p.Warm < 0 || p.Warm > MaxWarm:
			return nil, reject(Invalid, "pool %s: warm %d out of [0, %d]", p.PoolKey, p.Warm, MaxWarm)
		case p.WarmMax != 0 && p.WarmMax < p.Warm:
			return nil, reject(Invalid, "pool %s: warm_max %d below warm %d", p.PoolKey, p.WarmMax, p.Warm)
		case p.WarmMax > MaxWarm:
			return nil, reject(Invalid, "pool %s: warm_max %d over %d", p.PoolKey, p.WarmMax, MaxWarm)
		case p.IdleHibernateSeconds < 0 || p.IdleHibernateSeconds > MaxIdleSeconds:
			return nil, reject(Invalid, "pool %s: idle_hibernate_seconds %d out of [0, %d]", p.PoolKey, p.IdleHibernateSeconds, MaxIdleSeconds)
		}
		if p.WarmMax == 0 {
			p.WarmMax = p.Warm
		}
		total += p.WarmMax
		out[i] = p
	}
	if total > MaxTotalWarm {
		return nil, reject(Invalid, "pools hold up to %d warm VMs in all, at most %d", total, MaxTotalWarm)
	}
	sortSpecs(out)
	return out, nil
}

// ValidatePools checks a pool set as ConfigurePools does, for callers that
// must refuse it before anything is written (sandboxd's config on a first
// start: a refusal after the node's identity is recorded would make the
// next start no first start, and the fixed pools be ignored).
func ValidatePools(in []PoolSpec) error {
	_, err := normSpecs(in)
	return err
}
