package fsmsim

import (
	"fmt"

	"github.com/sbxlog/sbxlog/eventlog/event"
	"github.com/sbxlog/sbxlog/fsm"
)

// checkpoint returns a checkpoint command: take one of some claim, fork
// one, claim from or delete a listed checkpoint.
func (s *Sim) checkpoint(st *fsm.State) fsm.Command {
	listed := st.Checkpoints("")
	switch x := s.rng.intn(10); {
	case x < 3:
		return fsm.Checkpoint{Meta: s.meta(), ID: fmt.Sprintf("ck_%016x", s.rng.next()), Claim: s.someClaim(st),
			Tenant: s.tenant(), Name: fmt.Sprintf("n%d", s.rng.intn(5)), TTLSeconds: int64(s.rng.intn(3)) * int64(s.rng.intn(600))}
	case x < 6:
		n := 1 + s.rng.intn(3)
		kids := make([]string, n)
		for i := range kids {
			kids[i] = fmt.Sprintf("sb_%016x", s.rng.next())
			s.claims = append(s.claims, kids[i])
		}
		f := fsm.Fork{Meta: s.meta(), Parent: s.someClaim(st), Checkpoint: fmt.Sprintf("ck_%016x", s.rng.next()), Children: kids,
			TTLSeconds: int64(s.rng.intn(900))}
		if s.rng.intn(4) == 0 {
			f.ServeTimeoutSeconds = int64(1 + s.rng.intn(20))
		}
		if s.rng.intn(3) == 0 {
			f.ClaimRefPrefix = "team/"
		}
		return f
	case x < 8 && len(listed) > 0:
		id := fmt.Sprintf("sb_%016x", s.rng.next())
		s.claims = append(s.claims, id)
		return fsm.Claim{Meta: s.meta(), ID: id, Tenant: s.tenant(), Checkpoint: listed[s.rng.intn(len(listed))].ID,
			TTLSeconds: int64(s.rng.intn(900))}
	case x == 9 && s.rng.intn(2) == 0:
		return s.importCheckpoint(listed)
	case len(listed) > 0:
		ck := listed[s.rng.intn(len(listed))]
		tenant := ck.Tenant
		if s.rng.intn(4) == 0 {
			tenant = s.tenant() // maybe another tenant's: refused as unknown
		}
		return fsm.DeleteCheckpoint{Meta: s.meta(), ID: ck.ID, Tenant: tenant}
	}
	return fsm.DeleteCheckpoint{Meta: s.meta(), ID: "ck_0000000000000000"}
}

// importCheckpoint asks for a checkpoint of another node: a new id, or one
// already held (a no-op).
func (s *Sim) importCheckpoint(listed []fsm.CheckpointRec) fsm.Command {
	id := fmt.Sprintf("ck_%016x", s.rng.next())
	if len(listed) > 0 && s.rng.intn(4) == 0 {
		id = listed[s.rng.intn(len(listed))].ID
	}
	return fsm.ImportCheckpoint{Meta: s.meta(), ID: id, Origin: "10.0.0.2:7777"}
}

// importResult answers a FetchCheckpoint: the origin's record, or a
// failure of one of the reasons.
func (s *Sim) importResult(in fsm.FetchCheckpoint, m fsm.Meta, fail bool, rep *event.ExecReport) fsm.Command {
	if fail || s.rng.intn(5) == 0 {
		reason := []string{fsm.ImportNotFound, fsm.ImportUnreachable, fsm.ImportRefused}[s.rng.intn(3)]
		return fsm.CheckpointImportFailed{Meta: m, Checkpoint: in.Checkpoint, Error: reason + ": from " + in.Origin}
	}
	meta := fsm.CheckpointMeta{Key: s.keys[s.rng.intn(len(s.keys))], Tenant: s.tenant(), Name: fmt.Sprintf("n%d", s.rng.intn(5)),
		Claim: fmt.Sprintf("sb_%016x", s.rng.next()), Created: m.Now - int64(s.rng.intn(1000))*1e9 - 1}
	if s.rng.intn(2) == 0 {
		meta.Expires = m.Now + int64(s.rng.intn(600))*1e9
	}
	return fsm.CheckpointImported{Meta: m, Checkpoint: in.Checkpoint, SnapshotDir: "checkpoint/" + in.Checkpoint, Imported: meta, Report: rep}
}
