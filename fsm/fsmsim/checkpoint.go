package fsmsim

import (
	"fmt"

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
