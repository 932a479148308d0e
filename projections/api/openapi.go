package api

import (
	"net/http"

	"github.com/sbxlog/sbxlog/projections/auth"
	"github.com/sbxlog/sbxlog/projections/openapi"
)

// handleOpenAPI serves the API's OpenAPI 3 document (package openapi),
// without a token: it describes the routes, it holds nothing of the node.
func (s *Server) handleOpenAPI(w http.ResponseWriter, _ *http.Request, _ auth.Identity) error {
	doc, err := openapi.Document()
	if err != nil {
		return err
	}
	writeRaw(w, http.StatusOK, doc)
	return nil
}
