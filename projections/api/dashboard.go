package api

import (
	"net/http"

	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/dashboard"
)

// handleDashboard serves the dashboard's page (package dashboard) without
// a token: the page holds nothing of the node and reads the API with the
// token its user gives it.
func (s *Server) handleDashboard(w http.ResponseWriter, _ *http.Request, _ auth.Identity) error {
	dashboard.Serve(w, dashboard.IndexFile)
	return nil
}

// handleDashboardFile serves the page's script and style.
func (s *Server) handleDashboardFile(w http.ResponseWriter, r *http.Request, _ auth.Identity) error {
	name := r.PathValue("file")
	if !dashboard.Has(name) {
		return errorf(http.StatusNotFound, "no dashboard file %q", name)
	}
	dashboard.Serve(w, name)
	return nil
}
