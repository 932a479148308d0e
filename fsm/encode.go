package fsm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm/egress"
)

// State formats: the first byte of an encoded State. Decode reads every
// format a snapshot in a log may have been written in.
const (
	StateFormatV1 = 1
	// StateFormatV2 adds each VM's restart history.
	StateFormatV2 = 2
	// StateFormatV3 adds the node's drain, the tenant table and whether
	// the API owns it.
	StateFormatV3 = 3
	// StateFormatV4 adds the open relays.
	StateFormatV4 = 4
	// StateFormatV5 adds guarded egress: the egress classes and their
	// owner, the pools' policies, and the claims' pinned egress and env.
	StateFormatV5 = 5
	// StateFormatV6 adds the checkpoints, the VMs' source checkpoints and
	// the claims' checkpoint and fork; and the store: the VMs' mapped
	// goldens, retired snapshot dirs, promoted templates and promotes in
	// flight.
	// And volumes: the catalog and the claims' volumes.
	StateFormatV6 = 6
	// StateFormatV7 adds the archive: the pools' archive settings, the
	// archived VMs' archive names, the claims' on_expire and archive retry.
	StateFormatV7 = 7
	// StateFormatCurrent is the newest format this build writes and reads.
	StateFormatCurrent = StateFormatV7
)

// ErrStateFormat means an encoded State is of a format this build cannot
// read (written by a newer build); ErrStateCorrupt means it is malformed.
var (
	ErrStateFormat  = errors.New("fsm: state format not supported")
	ErrStateCorrupt = errors.New("fsm: state encoding corrupt")
)

// Layout (integers are uvarints unless noted; strings are length-prefixed):
//
//	format byte, applied
//	node, instance
//	max_claims, default_tenant_cap, n, n×(tenant, cap)
//	node park until (varint), reason
//	n pools × (key, warm, warm_max, idle (varint), draining, park until (varint), park reason, n warm ids oldest first)
//	n goldens × (key, status, op, req seq, snapshot dir, error, retry at (varint))
//	n VMs × (id, key, node, instance, run dir, status, claim, cold, op, req seq, snapshot dir, created (varint),
//	         [V2] n restarts × time (varint))
//	n claims × (id, key, vm, tenant, claim ref, n metadata × (k, v), tier, status, ttl, deadline, serve by,
//	            token gen, created, last activity, ended (varints), reason)
//	[V3] draining, tenants owned by the API,
//	     n tenants × (name, token sha256 (32 bytes), max_claims (varint), egress class)
//	[V4] n relays × (id, claim, kind, port, passive, opened (varint))
//	[V5] classes owned by the API, n classes × (name, policy),
//	     n pools with a policy × (key, policy),
//	     n claims with egress × (id, class, no egress, unpooled, n env × entry)
//	[V6] checkpoints (encoder.checkpoints in checkpoint.go),
//	     n VMs mapping a dir × (id, dir),
//	     n retired × (dir, owner, due by, op, req seq),
//	     n templates × (key, tenant, digest, created (varint), n labels × (k, v)),
//	     n promotes × (vm, target key, tenant)
//	     n volumes × (name, path, writable, n tenants × tenant),
//	     n claims with volumes × (id, n × (name, mount, rw, path, status, live, op, req, req seq))
//	[V7] n pools with archive settings × (key, archive after, archive delete after (varints)),
//	     n VMs with an archive × (id, archive),
//	     n claims with archive fields × (id, on_expire archive, archive retry at (varint))
//	policy: n rules × (host, n methods × method, n ports × port, secret, intercept), socks5
//	entry:  name, sealed, size (varint), host only, has inject, [n hosts × host, header, query, body, placeholder]
//
// Every collection is sorted by its key, so equal states encode to equal
// bytes. Indexes (timers, pending intents, counters) are not encoded: Decode
// rebuilds them from the records.

// Encode returns s's deterministic encoding.
func Encode(s *State) []byte {
	e := encoder{b: make([]byte, 0, 256+len(s.vms)*96+len(s.claims)*160), vmIDs: sortedKeys(s.vms), claimIDs: sortedKeys(s.claims)}
	e.b = append(e.b, StateFormatCurrent)
	e.u(s.applied)
	e.str(s.node)
	e.str(s.instance)
	e.i(int64(s.limits.MaxClaims))
	e.i(int64(s.limits.DefaultTenantCap))
	tenants := sortedKeys(s.limits.TenantCaps)
	e.u(uint64(len(tenants)))
	for _, t := range tenants {
		e.str(t)
		e.i(int64(s.limits.TenantCaps[t]))
	}
	e.i(s.nodeParkUntil)
	e.str(s.nodeParkReason)

	keys := sortedPoolKeys(s.pools)
	e.u(uint64(len(keys)))
	for _, k := range keys {
		p := s.pools[k]
		e.key(k)
		e.i(int64(p.Spec.Warm))
		e.i(int64(p.Spec.WarmMax))
		e.i(p.Spec.IdleHibernateSeconds)
		e.bool(p.Draining)
		e.i(p.ParkedUntil)
		e.str(p.ParkReason)
		e.u(uint64(len(p.warm)))
		for _, id := range p.warm {
			e.str(id)
		}
	}

	keys = sortedPoolKeys(s.goldens)
	e.u(uint64(len(keys)))
	for _, k := range keys {
		g := s.goldens[k]
		e.key(k)
		e.u(uint64(g.Status))
		e.op(g.Op)
		e.u(g.ReqSeq)
		e.str(g.SnapshotDir)
		e.str(g.Error)
		e.i(g.RetryAt)
	}

	e.u(uint64(len(e.vmIDs)))
	for _, id := range e.vmIDs {
		v := s.vms[id]
		e.str(v.ID)
		e.key(v.Key)
		e.str(v.Node)
		e.str(v.Instance)
		e.str(v.RunDir)
		e.u(uint64(v.Status))
		e.str(v.Claim)
		e.bool(v.Cold)
		e.op(v.Op)
		e.u(v.ReqSeq)
		e.str(v.SnapshotDir)
		e.i(v.Created)
		e.u(uint64(len(v.Restarts)))
		for _, t := range v.Restarts {
			e.i(t)
		}
	}

	e.u(uint64(len(e.claimIDs)))
	var withEgress []string // the claims the V5 section lists, in id order
	for _, id := range e.claimIDs {
		c := s.claims[id]
		if c.EgressClass != "" || c.NoEgress || c.Unpooled || len(c.Env) > 0 {
			withEgress = append(withEgress, id)
		}
		e.str(c.ID)
		e.key(c.Key)
		e.str(c.VM)
		e.str(c.Tenant)
		e.str(c.ClaimRef)
		mk := sortedKeys(c.Metadata)
		e.u(uint64(len(mk)))
		for _, k := range mk {
			e.str(k)
			e.str(c.Metadata[k])
		}
		e.u(uint64(c.Tier))
		e.u(uint64(c.Status))
		e.i(c.TTLSeconds)
		e.i(c.Deadline)
		e.i(c.ServeBy)
		e.u(uint64(c.TokenGen))
		e.i(c.Created)
		e.i(c.LastActivity)
		e.i(c.Ended)
		e.str(c.Reason)
	}

	e.bool(s.draining)
	e.bool(s.tenantsAPI)
	names := sortedKeys(s.tenants)
	e.u(uint64(len(names)))
	for _, name := range names {
		t := s.tenants[name]
		e.str(t.Name)
		e.b = append(e.b, t.sum[:]...)
		e.i(int64(t.MaxClaims))
		e.str(t.EgressClass)
	}

	ids := sortedKeys(s.relays)
	e.u(uint64(len(ids)))
	for _, id := range ids {
		r := s.relays[id]
		e.str(r.ID)
		e.str(r.Claim)
		e.str(r.Kind)
		e.u(uint64(r.Port))
		e.bool(r.Passive)
		e.i(r.Opened)
	}
	e.egress(s, withEgress)
	e.checkpoints(s)
	e.store(s)
	e.volumes(s)
	e.archive(s)
	return e.b
}

// egress encodes the V5 section; withEgress are the claims with an egress
// record, sorted.
func (e *encoder) egress(s *State, withEgress []string) {
	e.bool(s.classesAPI)
	names := sortedKeys(s.egressClasses)
	e.u(uint64(len(names)))
	for _, n := range names {
		e.str(n)
		e.policy(&s.egressClasses[n].Policy)
	}
	var withPolicy []PoolKey
	for _, k := range sortedPoolKeys(s.pools) {
		if s.pools[k].Egress != nil {
			withPolicy = append(withPolicy, k)
		}
	}
	e.u(uint64(len(withPolicy)))
	for _, k := range withPolicy {
		e.key(k)
		e.policy(s.pools[k].Egress)
	}
	e.u(uint64(len(withEgress)))
	for _, id := range withEgress {
		c := s.claims[id]
		e.str(id)
		e.str(c.EgressClass)
		e.bool(c.NoEgress)
		e.bool(c.Unpooled)
		e.u(uint64(len(c.Env)))
		for _, en := range c.Env {
			e.str(en.Name)
			e.str(en.Sealed)
			e.i(int64(en.Size))
			e.bool(en.HostOnly)
			e.bool(en.Inject != nil)
			if in := en.Inject; in != nil {
				e.u(uint64(len(in.Hosts)))
				for _, h := range in.Hosts {
					e.str(h)
				}
				e.str(in.Header)
				e.str(in.Query)
				e.bool(in.Body)
				e.str(in.Placeholder)
			}
		}
	}
}

func (e *encoder) policy(p *egress.Policy) {
	e.u(uint64(len(p.Allow)))
	for _, r := range p.Allow {
		e.str(r.Host)
		e.u(uint64(len(r.Methods)))
		for _, m := range r.Methods {
			e.str(m)
		}
		e.u(uint64(len(r.Ports)))
		for _, port := range r.Ports {
			e.u(uint64(port))
		}
		e.str(r.Secret)
		e.u(uint64(r.Intercept))
	}
	e.bool(p.Socks5)
}

// Hash returns the SHA-256 of s's encoding: equal states, equal hashes.
func Hash(s *State) [32]byte { return sha256.Sum256(Encode(s)) }

// HashHex is Hash in lowercase hex.
func HashHex(s *State) string { h := Hash(s); return fmt.Sprintf("%x", h[:]) }

// encoder appends a state's encoding to b. vmIDs and claimIDs are the
// state's VM and claim ids, sorted once per Encode: every section that
// lists some of them filters these (vmsWhere, claimsWhere) rather than
// sorting the whole map again.
type encoder struct {
	b               []byte
	vmIDs, claimIDs []string
}

// vmsWhere lists the ids, in order, of the VMs for which keep holds.
func (e *encoder) vmsWhere(s *State, keep func(*VMRec) bool) []string {
	var out []string
	for _, id := range e.vmIDs {
		if keep(s.vms[id]) {
			out = append(out, id)
		}
	}
	return out
}

// claimsWhere lists the ids, in order, of the claims for which keep holds.
func (e *encoder) claimsWhere(s *State, keep func(*ClaimRec) bool) []string {
	var out []string
	for _, id := range e.claimIDs {
		if keep(s.claims[id]) {
			out = append(out, id)
		}
	}
	return out
}

func (e *encoder) u(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) i(v int64)  { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) str(s string) {
	e.u(uint64(len(s)))
	e.b = append(e.b, s...)
}
func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *encoder) op(id event.OpID) { e.b = append(e.b, id[:]...) }
func (e *encoder) key(k PoolKey) {
	e.str(k.Template)
	e.str(k.Net)
	e.str(k.Size)
}

// Decode parses an encoding made by Encode and rebuilds every index. A
// newer format fails with ErrStateFormat, a malformed or inconsistent one
// with ErrStateCorrupt.
func Decode(b []byte) (*State, error) { return DecodeWith(b, DecodeOptions{}) }

// DecodeOptions tune DecodeWith.
type DecodeOptions struct {
	// SkipCheck skips the final Check (O(state), most of a large decode's
	// time). The structural checks of the encoding and of the rebuilt
	// indexes still run. It is for encodings whose bytes something else
	// vouches for, like a snapshot under the op log's checksum on a
	// daemon's restart path; tools that inspect a state keep the check.
	SkipCheck bool
}

// DecodeWith is Decode with options.
func DecodeWith(b []byte, o DecodeOptions) (*State, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrStateCorrupt)
	}
	format := b[0]
	if format < StateFormatV1 || format > StateFormatCurrent {
		return nil, fmt.Errorf("%w: format %d, this build reads %d to %d", ErrStateFormat, b[0], StateFormatV1, StateFormatCurrent)
	}
	d := &sdec{b: b[1:]}
	s := New()
	s.applied = d.u()
	s.node = d.str()
	s.instance = d.str()
	s.limits.MaxClaims = int(d.i())
	s.limits.DefaultTenantCap = int(d.i())
	if n := d.count(); n > 0 {
		s.limits.TenantCaps = make(map[string]int, n)
		for range n {
			t := d.str()
			s.limits.TenantCaps[t] = int(d.i())
		}
	}
	s.nodeParkUntil = d.i()
	s.nodeParkReason = d.str()

	for range d.count() {
		k := d.key()
		p := &PoolRec{Spec: PoolSpec{PoolKey: k}}
		p.Spec.Warm = int(d.i())
		p.Spec.WarmMax = int(d.i())
		p.Spec.IdleHibernateSeconds = d.i()
		p.Draining = d.bool()
		p.ParkedUntil = d.i()
		p.ParkReason = d.str()
		if n := d.count(); n > 0 {
			p.warm = make([]string, n)
			for i := range p.warm {
				p.warm[i] = d.str()
			}
		}
		d.check(s.pools[k] == nil, "pool %s twice", k)
		s.pools[k] = p
	}
	for range d.count() {
		g := &GoldenRec{Key: d.key()}
		g.Status = GoldenStatus(d.u())
		g.Op = d.op()
		g.ReqSeq = d.u()
		g.SnapshotDir = d.str()
		g.Error = d.str()
		g.RetryAt = d.i()
		d.check(g.Status >= GoldenBuilding && g.Status <= GoldenBroken && s.goldens[g.Key] == nil, "golden %s", g.Key)
		s.goldens[g.Key] = g
	}
	nVMs := d.count()
	s.vms = make(map[string]*VMRec, nVMs)
	for range nVMs {
		v := &VMRec{ID: d.str(), Key: d.key(), Node: d.istr(), Instance: d.istr(), RunDir: d.str()}
		v.Status = VMStatus(d.u())
		v.Claim = d.str()
		v.Cold = d.bool()
		v.Op = d.op()
		v.ReqSeq = d.u()
		v.SnapshotDir = d.str()
		v.Created = d.i()
		if format >= StateFormatV2 {
			if n := d.count(); n > 0 {
				d.check(n <= MaxRestartHistory, "VM %s: %d restarts", v.ID, n)
				v.Restarts = make([]int64, min(n, MaxRestartHistory))
				for i := range v.Restarts {
					v.Restarts[i] = d.i()
				}
			}
		}
		d.check(v.Status.inState() && s.vms[v.ID] == nil, "VM %s", v.ID)
		s.vms[v.ID] = v
	}
	nClaims := d.count()
	s.claims = make(map[string]*ClaimRec, nClaims)
	for range nClaims {
		c := &ClaimRec{ID: d.str(), Key: d.key(), VM: d.vmID(s.vms), Tenant: d.istr(), ClaimRef: d.str()}
		if v := s.vms[c.VM]; v != nil && v.Claim == c.ID {
			v.Claim = c.ID // share the string
		}
		if n := d.count(); n > 0 {
			c.Metadata = make(map[string]string, n)
			for range n {
				k := d.str()
				c.Metadata[k] = d.str()
			}
		}
		c.Tier = Tier(d.u())
		c.Status = ClaimStatus(d.u())
		c.TTLSeconds = d.i()
		c.Deadline = d.i()
		c.ServeBy = d.i()
		c.TokenGen = uint32(d.u())
		c.Created = d.i()
		c.LastActivity = d.i()
		c.Ended = d.i()
		c.Reason = d.istr()
		d.check(c.Tier >= TierWarm && c.Tier <= TierCold && c.Status >= ClaimPending && c.Status < numClaimStatus && s.claims[c.ID] == nil, "claim %s", c.ID)
		s.claims[c.ID] = c
	}
	if format >= StateFormatV3 {
		s.draining = d.bool()
		s.tenantsAPI = d.bool()
		for range d.count() {
			t := &TenantRec{Name: d.str(), sum: d.sum()}
			t.TokenSHA256 = hex.EncodeToString(t.sum[:])
			t.MaxClaims = int(d.i())
			t.EgressClass = d.str()
			_, dupHash := s.tenantByHash[t.sum]
			d.check(t.MaxClaims >= 0 && s.tenants[t.Name] == nil && !dupHash, "tenant %q", t.Name)
			s.tenants[t.Name] = t
			s.tenantByHash[t.sum] = t.Name
		}
	}
	if format >= StateFormatV4 {
		for range d.count() {
			r := &RelayRec{ID: d.str(), Claim: d.claimID(s.claims), Kind: d.istr()}
			port := d.u()
			r.Passive = d.bool()
			r.Opened = d.i()
			d.check(validRelayKind(r.Kind, port) && s.relays[r.ID] == nil, "relay %s", r.ID)
			r.Port = int(port)
			if d.err != nil {
				break
			}
			s.addRelay(r)
		}
	}
	if format >= StateFormatV5 {
		d.egress(s)
	}
	if format >= StateFormatV6 {
		d.checkpoints(s)
		d.store(s)
		d.volumes(s)
	}
	if format >= StateFormatV7 {
		d.archive(s)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrStateCorrupt, len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	if err := s.rebuild(); err != nil {
		return nil, err
	}
	if format < StateFormatV6 {
		s.upgradeStore()
	}
	// A snapshot that decodes but breaks an invariant (a flipped bit in a
	// key, say) must not become the daemon's state.
	if o.SkipCheck {
		return s, nil
	}
	if err := s.Check(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStateCorrupt, err)
	}
	return s, nil
}

// rebuild derives every index from the records and checks that they agree
// with each other (each warm id is a warm VM of its pool, exactly once). The
// order of map iteration only affects the heap's array layout, which nothing
// observes.
func (s *State) rebuild() error {
	s.timers.index = make(map[timerKey]*timer, len(s.claims)+len(s.pools))
	s.timers.items = make([]*timer, 0, len(s.claims)+len(s.pools))
	for id, v := range s.vms { //fsm:unordered counters and sets only
		s.vmCount[v.Status]++
		if hasIntent(v.Status) {
			s.pendingVMs[id] = struct{}{}
		}
		if p := s.pools[v.Key]; p != nil {
			p.vms++
			if isRefill(v) {
				p.refilling++
			}
		}
	}
	onStack := 0
	for k, p := range s.pools { //fsm:unordered checks only
		for _, id := range p.warm {
			v := s.vms[id]
			if v == nil || v.Status != VMWarm || v.Key != k {
				return fmt.Errorf("%w: warm stack of %s holds %s", ErrStateCorrupt, k, id)
			}
			onStack++
		}
	}
	if onStack != s.vmCount[VMWarm] {
		return fmt.Errorf("%w: %d warm VMs, %d on warm stacks", ErrStateCorrupt, s.vmCount[VMWarm], onStack)
	}
	for k, g := range s.goldens { //fsm:unordered set only
		if g.Status == GoldenBuilding {
			s.pendingGoldens[k] = struct{}{}
		}
	}
	for _, c := range s.claims { //fsm:unordered counters and heap pushes; heapify below
		s.claimCount[c.Status]++
		if c.Status.Live() {
			s.liveDelta(c, 1)
		} else {
			s.purge.push(timerKey{kind: tPurge, id: c.ID}, c.Ended+ClaimRetentionNS)
		}
		for _, k := range claimTimerKinds {
			if at, on := s.claimTimer(c, k); on {
				s.timers.push(timerKey{kind: k, id: c.ID}, at)
			}
		}
	}
	for k, p := range s.pools { //fsm:unordered heap pushes and sets; heapify below
		if p.ParkedUntil != 0 {
			s.timers.push(poolTimer(tPark, k), p.ParkedUntil)
		}
		if at, on := s.goldenTimer(k); on {
			s.timers.push(poolTimer(tGolden, k), at)
		}
		s.syncRefill(k)
	}
	if s.nodeParkUntil != 0 {
		s.timers.push(timerKey{kind: tPark, id: "*"}, s.nodeParkUntil)
	}
	s.rebuildCheckpoints()
	s.rebuildStore()
	s.timers.heapify()
	s.purge.heapify()
	return nil
}

type sdec struct {
	b   []byte
	err error
	// interned holds the strings that repeat across records (pool keys,
	// node, instance, tenants, reasons), so a decoded state shares them.
	interned map[string]string
}

// istr reads a string, sharing one copy per distinct value. The lookup
// string(b) does not allocate.
func (d *sdec) istr() string {
	raw := d.raw()
	if s, ok := d.interned[string(raw)]; ok {
		return s
	}
	s := string(raw)
	if d.interned == nil {
		d.interned = map[string]string{}
	}
	if len(d.interned) < 1<<16 {
		d.interned[s] = s
	}
	return s
}

func (d *sdec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrStateCorrupt, fmt.Sprintf(format, args...))
	}
	d.b = nil
}

func (d *sdec) check(ok bool, format string, args ...any) {
	if !ok {
		d.fail(format, args...)
	}
}

func (d *sdec) u() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *sdec) i() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("truncated")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a collection length, bounded by the bytes left so a corrupt
// length cannot make Decode allocate without limit.
func (d *sdec) count() int {
	n := d.u()
	if n > uint64(len(d.b)) {
		d.fail("count %d over %d bytes left", n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *sdec) str() string { return string(d.raw()) }

// raw reads a length-prefixed string's bytes (aliasing the input).
func (d *sdec) raw() []byte {
	n := d.u()
	if n > uint64(len(d.b)) {
		d.fail("string of %d bytes, %d left", n, len(d.b))
		return nil
	}
	b := d.b[:n]
	d.b = d.b[n:]
	return b
}

// claimID reads a claim id, sharing the record's copy when the claim
// exists.
func (d *sdec) claimID(claims map[string]*ClaimRec) string {
	raw := d.raw()
	if c, ok := claims[string(raw)]; ok {
		return c.ID
	}
	return string(raw)
}

// vmID reads a VM id, sharing the record's copy when the VM exists.
func (d *sdec) vmID(vms map[string]*VMRec) string {
	raw := d.raw()
	if v, ok := vms[string(raw)]; ok {
		return v.ID
	}
	return string(raw)
}

func (d *sdec) bool() bool {
	if len(d.b) < 1 || d.b[0] > 1 {
		d.fail("bad bool")
		return false
	}
	v := d.b[0] == 1
	d.b = d.b[1:]
	return v
}

func (d *sdec) op() event.OpID {
	var id event.OpID
	if len(d.b) < len(id) {
		d.fail("truncated op id")
		return id
	}
	copy(id[:], d.b)
	d.b = d.b[len(id):]
	return id
}

func (d *sdec) sum() [32]byte {
	var sum [32]byte
	if len(d.b) < len(sum) {
		d.fail("truncated token hash")
		return sum
	}
	copy(sum[:], d.b)
	d.b = d.b[len(sum):]
	return sum
}

// egress decodes the V5 section.
func (d *sdec) egress(s *State) {
	s.classesAPI = d.bool()
	for range d.count() {
		n := d.str()
		p := d.policy()
		d.check(s.egressClasses[n] == nil, "egress class %q twice", n)
		s.egressClasses[n] = &EgressClassRec{Name: n, Policy: p}
	}
	for range d.count() {
		k := d.key()
		p := d.policy()
		pool := s.pools[k]
		d.check(pool != nil && pool.Egress == nil, "egress policy of pool %s", k)
		if pool != nil {
			pool.Egress = &p
		}
	}
	for range d.count() {
		id := d.str()
		c := s.claims[id]
		d.check(c != nil, "egress of claim %s", id)
		if c == nil {
			c = &ClaimRec{}
		}
		c.EgressClass = d.istr()
		c.NoEgress = d.bool()
		c.Unpooled = d.bool()
		if n := d.count(); n > 0 {
			c.Env = make([]egress.EnvEntry, n)
			for i := range c.Env {
				en := egress.EnvEntry{Name: d.str(), Sealed: d.str(), Size: int(d.i()), HostOnly: d.bool()}
				if d.bool() {
					in := &egress.EnvInject{}
					if m := d.count(); m > 0 {
						in.Hosts = make([]string, m)
						for j := range in.Hosts {
							in.Hosts[j] = d.str()
						}
					}
					in.Header, in.Query, in.Body, in.Placeholder = d.str(), d.str(), d.bool(), d.str()
					en.Inject = in
				}
				c.Env[i] = en
			}
		}
	}
}

func (d *sdec) policy() egress.Policy {
	var p egress.Policy
	if n := d.count(); n > 0 {
		p.Allow = make([]egress.Rule, n)
		for i := range p.Allow {
			r := egress.Rule{Host: d.str()}
			if m := d.count(); m > 0 {
				r.Methods = make([]string, m)
				for j := range r.Methods {
					r.Methods[j] = d.str()
				}
			}
			if m := d.count(); m > 0 {
				r.Ports = make([]uint16, m)
				for j := range r.Ports {
					v := d.u()
					d.check(v > 0 && v <= 65535, "port %d", v)
					r.Ports[j] = uint16(v)
				}
			}
			r.Secret = d.str()
			mode := d.u()
			d.check(mode <= uint64(egress.InterceptAlways), "intercept mode %d", mode)
			r.Intercept = egress.Intercept(mode)
			p.Allow[i] = r
		}
	}
	p.Socks5 = d.bool()
	return p
}

func (d *sdec) key() PoolKey {
	return PoolKey{Template: d.istr(), Net: d.istr(), Size: d.istr()}
}
