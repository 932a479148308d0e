package fsm

// TenantsLive returns the live claims of every tenant that holds any, by
// tenant name; root's claims (the empty tenant) are left out. It costs
// O(tenants holding claims), so a metrics scrape can read it under the
// engine's read lock without walking the claims.
func (s *State) TenantsLive() map[string]int {
	out := make(map[string]int, len(s.tenantLive))
	for name, n := range s.tenantLive { //fsm:unordered copied into a map
		if name != "" && n > 0 {
			out[name] = n
		}
	}
	return out
}
