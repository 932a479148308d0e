package silkagent

import (
	"bufio"
	"os"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/transport"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// A git op that must reach another machine (clone, push or pull of an
// http, https, ssh or git URL) on a guest without egress is answered
// error{kind: "unimplemented"} naming fs_push, as the old agent answered
// on the none lane: callers branch on that kind to move a repository in
// another way, where a dial's "network is unreachable" would be an
// internal error they cannot tell from a failing server. A local
// repository (a path or file:// URL) needs no network and is served on
// every lane.

// noEgressMessage is the old agent's answer, naming the op by its wire name.
const noEgressMessage = "no network on this sandbox; use fs_push to move a repository in"

// egress reports whether the guest can reach a network: s.Egress, else
// hasDefaultRoute. A none-lane guest has a NIC (QEMU's restricted user
// network, which carries the data plane and even advertises an IPv6
// default route that leads nowhere): only the IPv4 default route that the
// egress lane's network verb installs (agent.NetConfig is IPv4) says the
// guest can leave.
func (s *Server) egress() bool {
	if s.Egress != nil {
		return s.Egress()
	}
	return hasDefaultRoute()
}

// needEgress is nil when url can be reached from this guest, else the
// typed unimplemented error of the none lane.
func (s *Server) needEgress(url string) error {
	if !isNetworkURL(url) || s.egress() {
		return nil
	}
	return silkd.Errorf(silkd.KindUnimplemented, "%s", noEgressMessage)
}

// isNetworkURL says whether git reaches url over a network (any transport
// but file, which go-git also picks for a bare path).
func isNetworkURL(url string) bool {
	ep, err := transport.NewEndpoint(url)
	return err == nil && ep.Protocol != "file"
}

// remoteURL is the first URL of r's remote name, or "" (a missing remote
// is left to the push or pull to report).
func remoteURL(r *git.Repository, name string) string {
	rem, err := r.Remote(name)
	if err != nil || len(rem.Config().URLs) == 0 {
		return ""
	}
	return rem.Config().URLs[0]
}

// ipv4Routes is the kernel's IPv4 route table, read for a default route.
var ipv4Routes = "/proc/net/route"

// hasDefaultRoute reports whether the kernel has an IPv4 route to
// 00000000; an unreadable table has none.
func hasDefaultRoute() bool {
	f, err := os.Open(ipv4Routes)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 1 && fields[1] == "00000000" {
			return true
		}
	}
	return false
}
