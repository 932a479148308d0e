package api

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/projections/auth"
)

// What templates exist on this node, in one place: GET /v1/templates lists
// them, and the 404 of a template that is not among them (a claim, a
// PUT /v1/pools) names them, so the answer to "nope does not exist" says
// what does. The old daemon had no listing (its /v1/info listed promoted
// templates only); this route is sbxlog's.
//
// Three kinds, each a way a claim of the name is served here:
//   - configured: a pool of the node's config (GET /v1/pools), by its key;
//   - image: a template the hypervisor driver boots from its own files (a
//     Cloud Hypervisor template dir, a QEMU template table entry), any net
//     and size (PoolSupport.Templates);
//   - promoted: a promoted template, by its key (root sees all, a tenant
//     its own: the same scoping as GET /v1/info's "templates").

// The kinds of a TemplateEntry.
const (
	TemplateConfigured = "configured"
	TemplateImage      = "image"
	TemplatePromoted   = "promoted"
)

// TemplateEntry is one row of GET /v1/templates.
type TemplateEntry struct {
	Template string `json:"template"`
	// Kind is configured, image or promoted.
	Kind string `json:"kind"`
	// Net and Size: the key of a configured pool or a promoted template;
	// absent for an image, which any net and size may use.
	Net  string `json:"net,omitempty"`
	Size string `json:"size,omitempty"`
	// Tenant, ContentDigest, Labels: a promoted template's.
	Tenant        string            `json:"tenant,omitempty"`
	ContentDigest string            `json:"content_digest,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
}

// TemplatesResponse is GET /v1/templates's body.
type TemplatesResponse struct {
	Templates []TemplateEntry `json:"templates"`
}

func (s *Server) handleTemplates(w http.ResponseWriter, _ *http.Request, id auth.Identity) error {
	writeJSON(w, http.StatusOK, TemplatesResponse{Templates: s.templateEntries(id)})
	return nil
}

// templateEntries lists the templates id may see, sorted by name, kind,
// net and size.
func (s *Server) templateEntries(id auth.Identity) []TemplateEntry {
	out := []TemplateEntry{}
	s.eng.View(func(st *fsm.State) {
		for _, p := range st.Pools() {
			if !p.Draining {
				out = append(out, TemplateEntry{Template: p.Spec.Template, Kind: TemplateConfigured, Net: p.Spec.Net, Size: p.Spec.Size})
			}
		}
		for _, t := range st.Templates() {
			if id.Kind == auth.Root || t.Tenant == id.Tenant {
				out = append(out, TemplateEntry{Template: t.Key.Template, Kind: TemplatePromoted, Net: t.Key.Net, Size: t.Key.Size,
					Tenant: t.Tenant, ContentDigest: t.Digest, Labels: t.Labels})
			}
		}
	})
	if s.pools != nil {
		for _, name := range s.pools.Templates() {
			out = append(out, TemplateEntry{Template: name, Kind: TemplateImage})
		}
	}
	slices.SortFunc(out, func(a, b TemplateEntry) int {
		return cmp.Or(cmp.Compare(a.Template, b.Template), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Net, b.Net), cmp.Compare(a.Size, b.Size))
	})
	return out
}

// maxNamed bounds the names a 404 lists; GET /v1/templates has the rest.
const maxNamed = 16

// namingKnown adds to checkPool's 404 (an unknown template) the names of
// the templates id may claim here; any other error is returned as it is.
func (s *Server) namingKnown(err error, id auth.Identity) error {
	var he *httpError
	if !errors.As(err, &he) || he.status != http.StatusNotFound {
		return err
	}
	var names []string
	for _, e := range s.templateEntries(id) {
		if len(names) == 0 || names[len(names)-1] != e.Template {
			names = append(names, e.Template)
		}
	}
	var list string
	switch {
	case len(names) == 0:
		list = "this node has none"
	case len(names) > maxNamed:
		list = fmt.Sprintf("templates here: %s and %d more", strings.Join(names[:maxNamed], ", "), len(names)-maxNamed)
	default:
		list = "templates here: " + strings.Join(names, ", ")
	}
	return errorf(http.StatusNotFound, "%s; %s (sbxctl templates, GET /v1/templates)", he.msg, list)
}
