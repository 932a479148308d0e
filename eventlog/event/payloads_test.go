package event

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// samplePayloads holds one fully populated payload per type, so that every
// field's JSON name and shape is pinned by a golden file.
func samplePayloads() []Payload {
	key := PoolKey{Template: "py:3.12/base", Net: "egress", Size: "small"}
	rep := &ExecReport{Steps: []Step{{Name: "restore", NS: 26_000_000}, {Name: "resume", NS: 1_500_000}}, CopyMode: "reflink"}
	return []Payload{
		NodeConfigured{Node: "node-a", Instance: "i7f3a"},
		PoolsConfigured{Pools: []PoolSpec{{PoolKey: key, Warm: 4, WarmMax: 8, IdleHibernateSeconds: 300, ArchiveAfterSeconds: 3600, ArchiveDeleteAfterSeconds: 86400}}},
		LimitsConfigured{MaxClaims: 1000, DefaultTenantCap: 50, TenantCaps: []TenantCap{{Tenant: "acme", Cap: 200}}},
		GoldenBuildRequested{Key: key, Reason: "new"},
		GoldenBuilt{Key: key, SnapshotDir: "goldens/py:3.12/base/egress/small", Report: rep},
		GoldenFailed{Key: key, Error: "vm.boot: 500", RetryAtNS: 1_790_000_030_000_000_000},
		VMCloneRequested{VM: "vm-0011223344556677", Key: key, Node: "node-a", Instance: "i7f3a", RunDir: "i7f3a/vm-0011223344556677", Claim: "sb_00112233445566ff", Cold: true},
		VMCloned{VM: "vm-0011223344556677", Report: rep},
		VMCloneFailed{VM: "vm-0011223344556677", Error: "vm.restore: 500"},
		VMDestroyRequested{VM: "vm-0011223344556677", Reason: "release"},
		VMDestroyed{VM: "vm-0011223344556677", Report: rep},
		VMExited{VM: "vm-0011223344556677", Detail: "signal: killed"},
		ClaimCreated{Claim: "sb_00112233445566ff", Key: key, VM: "vm-0011223344556677", Tier: "warm", Tenant: "acme", ClaimRef: "job-17",
			Metadata: map[string]string{"a": "1", "b": "2"}, TTLSeconds: 300, DeadlineNS: 1_790_000_300_000_000_000, ServeByNS: 1_790_000_060_000_000_000, TokenGen: 1,
			EgressClass: "desk", PolicyLayer: "pooled", Env: sampleEnv(), OnExpire: OnExpireArchive},
		ClaimServed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677"},
		ClaimFailed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Reason: "clone_failed", Error: "vm.restore: 500"},
		ClaimRenewed{Claim: "sb_00112233445566ff", TTLSeconds: 600, DeadlineNS: 1_790_000_600_000_000_000, OnExpire: OnExpireArchive},
		ClaimTouched{Claim: "sb_00112233445566ff"},
		ClaimReleased{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677"},
		ClaimExpired{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677"},
		HibernateRequested{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Reason: "idle"},
		Hibernated{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", SnapshotDir: "snapshots/sb_00112233445566ff", Report: rep},
		HibernateFailed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Error: "vm.snapshot: 500", Lost: true},
		WakeRequested{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", SnapshotDir: "snapshots/sb_00112233445566ff"},
		Woken{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Report: rep},
		WakeFailed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Error: "vm.restore: 500", Lost: true},
		PoolParked{Key: &key, UntilNS: 1_790_000_030_000_000_000, Reason: "capacity"},
		PoolUnparked{Key: &key},
		VMRestartRequested{VM: "vm-0011223344556677", Claim: "sb_00112233445566ff", Reason: "exited", Attempt: 2},
		VMRestarted{VM: "vm-0011223344556677", Report: rep},
		VMRestartFailed{VM: "vm-0011223344556677", Error: "restart boot: vm.boot: 500"},
		TenantPut{Name: "u:42/west", TokenSHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", MaxClaims: 50, EgressClass: "desk", Config: true},
		TenantRemoved{Name: "u:42/west", Config: true},
		NodeDrained{},
		NodeUncordoned{},
		RelayOpened{Relay: "rl_0011223344556677", Claim: "sb_00112233445566ff", Kind: "port", Port: 8080, Passive: true},
		RelayClosed{Relay: "rl_0011223344556677", Claim: "sb_00112233445566ff", Reason: "client", BytesIn: 1048576, BytesOut: 2097152},
		EgressPoolSet{Key: key, Policy: &EgressPolicy{Socks5: true, Allow: []EgressRule{
			{Host: "api.github.com", Methods: []string{"GET", "POST"}, Ports: []uint16{443}, Secret: "gh", Intercept: InterceptAlways},
			{Host: "*.googleapis.com"},
			{Host: "*", Intercept: InterceptInject},
		}}},
		EgressClassPut{Name: "desk", Policy: EgressPolicy{Allow: []EgressRule{{Host: "api.github.com", Methods: []string{"CONNECT"}}}}, Config: true},
		EgressClassRemoved{Name: "desk", Config: true},
		ClaimEnvChanged{Claim: "sb_00112233445566ff", Set: sampleEnv(), Remove: []string{"OLD"}},
		EgressUsage{Claim: "sb_00112233445566ff", Key: &key, Tenant: "acme", FromNS: 1_790_000_000_000_000_000, ToNS: 1_790_000_060_000_000_000,
			Tx: 5120, Rx: 1_048_576, Allowed: 12, Denied: 2, Final: true},
		CheckpointRequested{Checkpoint: "ck_0011223344556677", Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Key: key, Tenant: "acme",
			Name: "before-migrate", Source: "hibernate/vm-0011223344556677-01J0000000000000000000000", Fork: true, ExpiresNS: 1_790_086_400_000_000_000},
		CheckpointTaken{Checkpoint: "ck_0011223344556677", SnapshotDir: "checkpoint/ck_0011223344556677", Report: rep},
		CheckpointFailed{Checkpoint: "ck_0011223344556677", Error: "vm.snapshot: 500", Lost: true},
		CheckpointDeleteRequested{Checkpoint: "ck_0011223344556677", Reason: "expired"},
		CheckpointDeleted{Checkpoint: "ck_0011223344556677", Report: rep},
		PromoteRequested{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Key: PoolKey{Template: "myproj:v1", Net: "none", Size: "small"}, Tenant: "acme"},
		Promoted{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Key: PoolKey{Template: "myproj:v1", Net: "none", Size: "small"},
			SnapshotDir: "template/myproj_v1_none_small-01J00000000000000000000000", Digest: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", Report: rep},
		PromoteFailed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Error: "vm.snapshot: 500", Lost: true},
		TemplateDeleted{Key: PoolKey{Template: "myproj:v1", Net: "none", Size: "small"}},
		TemplateLabelsSet{Key: PoolKey{Template: "myproj:v1", Net: "none", Size: "small"}, Labels: map[string]string{"team": "a", "v1": "sha256:aa"}},
		SnapshotCollected{Dir: "golden/py_3.12_none_small-01J00000000000000000000000"},
		VolumesConfigured{Volumes: []VolumeSpec{{Name: "imagenet", Path: "/srv/volumes/imagenet.img"},
			{Name: "scratch-db", Path: "/srv/volumes/scratch.img", Writable: true, Tenants: []string{"acme"}}}},
		VolumeAttachRequested{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677",
			Volumes: []ClaimVolume{{Name: "weights", Mount: "/models", Path: "/srv/volumes/weights.img"}}},
		VolumeAttached{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Volume: "weights"},
		VolumeAttachFailed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Volume: "weights", Error: "no such device"},
		VolumeDetachRequested{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Volumes: []string{"weights"}},
		VolumeDetached{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Volume: "weights"},
		VolumeDetachFailed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Volume: "weights", Error: "target is busy"},
		ArchiveRequested{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Reason: "expire"},
		Archived{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Archive: "i7f3a/vm-0011223344556677-01J0000000000000000000000", RetainUntilNS: 1_790_086_400_000_000_000, Report: rep},
		ArchiveFailed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Error: "put: ENOSPC", Lost: true, RetryAtNS: 1_790_000_030_000_000_000},
		UnarchiveRequested{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Archive: "i7f3a/vm-0011223344556677-01J0000000000000000000000"},
		Unarchived{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", SnapshotDir: "hibernate/vm-0011223344556677-01J0000000000000000000001", DeadlineNS: 1_790_000_300_000_000_000, Report: rep},
		UnarchiveFailed{Claim: "sb_00112233445566ff", VM: "vm-0011223344556677", Error: "memory-ranges: sha256 mismatch", Lost: true},
		CheckpointImportRequested{Checkpoint: "ck_a1b2223344556677", Origin: "10.0.0.5:7777"},
		CheckpointImported{Checkpoint: "ck_a1b2223344556677", SnapshotDir: "checkpoint/ck_a1b2223344556677", Key: key, Name: "before-migrate",
			Tenant: "acme", Claim: "sb_a1b2223344556677", CreatedNS: 1_790_000_000_000_000_000, ExpiresNS: 1_790_086_400_000_000_000, Report: rep},
		CheckpointImportFailed{Checkpoint: "ck_a1b2223344556677", Reason: "refused", Error: "memory-ranges: sha256 mismatch"},
	}
}

// sampleEnv is a claim env: a guest entry and a host-only credential,
// each value sealed (the bytes here stand for a ciphertext).
func sampleEnv() []EnvEntry {
	return []EnvEntry{
		{Name: "API_KEY", Sealed: "k1a2b3c4:c2VhbGVkIHZhbHVl", Size: 32, HostOnly: true,
			Inject: &EnvInject{Hosts: []string{"api.example.com", "*.example.net"}, Query: "key", Body: true, Placeholder: "PLACEHOLDER"}},
		{Name: "MODE", Sealed: "k1a2b3c4:bW9kZQ", Size: 4},
	}
}

func payloadGolden(t Type, v uint16) string {
	return filepath.Join("testdata", "payloads", fmt.Sprintf("%s_v%d.json", t, v))
}

// Every known type has a decoder for each of its versions and a golden sample
// per version that still decodes and re-encodes byte for byte. A pinned file
// is never rewritten: a change of shape needs a new version.
func TestPayloadGoldens(t *testing.T) {
	samples := map[Type]Payload{}
	for _, p := range samplePayloads() {
		if _, dup := samples[p.EventType()]; dup {
			t.Fatalf("two samples for %s", p.EventType())
		}
		samples[p.EventType()] = p
	}
	for _, ty := range Types() {
		sample, ok := samples[ty]
		if !ok {
			t.Errorf("%s: no sample payload in samplePayloads", ty)
			continue
		}
		cur, err := EncodePayload(sample)
		if err != nil {
			t.Fatalf("%s: encode sample: %v", ty, err)
		}
		checkGolden(t, payloadGolden(ty, ty.Version()), cur)
		for v := uint16(1); v <= ty.Version(); v++ {
			if _, ok := decoders[ty][v]; !ok {
				t.Errorf("%s: no decoder for v%d", ty, v)
				continue
			}
			pinned, err := os.ReadFile(payloadGolden(ty, v))
			if err != nil {
				t.Errorf("%s v%d: %v", ty, v, err)
				continue
			}
			p, err := DecodePayload(ty, v, pinned)
			if err != nil {
				t.Errorf("%s v%d: golden no longer decodes: %v", ty, v, err)
				continue
			}
			if p.EventType() != ty {
				t.Errorf("%s v%d: decodes to %T of type %s", ty, v, p, p.EventType())
			}
			if v == ty.Version() {
				if !reflect.DeepEqual(p, sample) {
					t.Errorf("%s: golden decodes to %+v, want %+v", ty, p, sample)
				}
				re, err := EncodePayload(p)
				if err != nil || !bytes.Equal(re, pinned) {
					t.Errorf("%s: re-encoding differs (%v):\n got %s\nwant %s", ty, err, re, pinned)
				}
			}
		}
	}
}

// A payload registered for decoding must round-trip through New and Decode.
func TestNewDecodeRoundTrip(t *testing.T) {
	op := OpIDFromUint(1_790_000_000_000, 3)
	for _, p := range samplePayloads() {
		e, err := New(p, "agg", op, ZeroOpID, 1)
		if err != nil {
			t.Fatalf("New(%T): %v", p, err)
		}
		got, err := e.Decode()
		if err != nil || !reflect.DeepEqual(got, p) {
			t.Fatalf("%T: round trip = %+v, %v", p, got, err)
		}
	}
}

func TestDecodeUnknownVersion(t *testing.T) {
	if _, err := DecodePayload(TypeClaimCreated, 99, []byte(`{}`)); err == nil {
		t.Fatal("decoded an unknown version")
	}
	if _, err := DecodePayload(TypeClaimCreated, 1, []byte(`{"claim":`)); err == nil {
		t.Fatal("decoded truncated JSON")
	}
}

func TestPoolKeyString(t *testing.T) {
	for _, s := range []string{"a/none/small", "py:3.12/base/x/egress/2xlarge"} {
		k, err := ParsePoolKey(s)
		if err != nil || k.String() != s {
			t.Fatalf("ParsePoolKey(%q) = %+v, %v", s, k, err)
		}
	}
	k, _ := ParsePoolKey("py:3.12/base/x/egress/2xlarge")
	if k.Template != "py:3.12/base/x" || k.Net != "egress" || k.Size != "2xlarge" {
		t.Fatalf("split wrong: %+v", k)
	}
	for _, s := range []string{"", "a", "a/b", "/none/small", "a//small", "a/none/"} {
		if _, err := ParsePoolKey(s); err == nil {
			t.Fatalf("ParsePoolKey(%q) accepted", s)
		}
	}
}
