package fsmsim

import "github.com/sbxlog/sbxlog/fsm"

// volumeNames are the sim's catalog names; "rwdata" is the writable one.
var volumeNames = []string{"imagenet", "weights", "rwdata", "gone"}

// volumeCatalog is a catalog of most of volumeNames (sometimes without
// "gone", so attachments outlive their entry).
func (s *Sim) volumeCatalog() fsm.Command {
	var specs []fsm.VolumeSpec
	for _, n := range volumeNames {
		if n == "gone" && s.rng.intn(2) == 0 {
			continue
		}
		spec := fsm.VolumeSpec{Name: n, Path: "/srv/volumes/" + n + ".img", Writable: n == "rwdata"}
		if n == "weights" && s.rng.intn(3) == 0 {
			spec.Tenants = []string{"acme"}
		}
		specs = append(specs, spec)
	}
	return fsm.ConfigureVolumes{Meta: s.meta(), Volumes: specs}
}

// claimVolumes gives a claim some volumes, sometimes read-write (often
// refused as busy), sometimes attach-only.
func (s *Sim) claimVolumes(c *fsm.Claim) {
	n := 1 + s.rng.intn(2)
	for i := range n {
		name := volumeNames[s.rng.intn(len(volumeNames))]
		if i > 0 && name == c.Volumes[0].Name {
			continue
		}
		mode := "ro"
		if name == "rwdata" && s.rng.intn(2) == 0 {
			mode = "rw"
		}
		c.Volumes = append(c.Volumes, fsm.VolumeRequest{Name: name, Mode: mode})
	}
	c.VolumesAttachOnly = s.rng.intn(5) == 0
}

// volumeOp attaches or detaches a volume on some claim.
func (s *Sim) volumeOp(st *fsm.State) fsm.Command {
	switch s.rng.intn(5) {
	case 0:
		return s.volumeCatalog()
	case 1, 2:
		name := volumeNames[s.rng.intn(len(volumeNames))]
		return fsm.AttachVolumes{Meta: s.meta(), Claim: s.someClaim(st), Volumes: []fsm.VolumeRequest{{Name: name}}}
	}
	// Mostly a volume some claim has attached.
	if s.rng.intn(4) > 0 {
		for _, id := range st.ClaimIDs() {
			c, _ := st.Claim(id)
			for _, v := range c.Volumes {
				if v.Status == fsm.VolumeAttached && !v.RW && s.rng.intn(2) == 0 {
					return fsm.DetachVolumes{Meta: s.meta(), Claim: id, Names: []string{v.Name}}
				}
			}
		}
	}
	return fsm.DetachVolumes{Meta: s.meta(), Claim: s.someClaim(st), Names: []string{volumeNames[s.rng.intn(len(volumeNames))]}}
}

// volumeResult answers a volume intent; a guest's mount being busy is
// common enough that detaches fail more often than the workload's rate.
func (s *Sim) volumeResult(in fsm.Intent, m fsm.Meta, fail bool) fsm.Command {
	if _, detach := in.(fsm.DetachVolume); detach && s.rng.intn(5) == 0 {
		fail = true
	}
	if fail {
		return in.Failed(m, "device busy", false)
	}
	return in.Succeeded(m, fsm.Outcome{})
}
