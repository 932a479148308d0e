// Package dashboard holds sandboxd's web dashboard: static files (HTML, CSS
// and JavaScript, no third-party code, nothing fetched from elsewhere),
// embedded in the binary and served by package api at / and
// /dashboard/{file}.
//
// The files hold nothing of the node: the page asks for the root token
// (a form), keeps it in the tab's sessionStorage and sends it as a bearer
// token to this node's API only, so the dashboard can do exactly what the
// API lets that token do, and no more. It reads GET /v1/info and GET
// /v1/sandboxes once, then follows GET /v1/events (the op log, from a
// little before that read, and ?view=vms) through fetch streams (an
// EventSource cannot send a bearer token): each event says what changed
// and only that is read again (a sandbox's row, the info after a pool,
// golden, VM or node event, or on the stream's heartbeat); nothing polls.
// Plots are SVG drawn by the page itself.
//
// Every answer carries a Content-Security-Policy that allows only this
// origin's scripts, styles and API (no inline script, no other host) and
// no framing.
package dashboard

import (
	"embed"
	"io/fs"
	"mime"
	"net/http"
	"path"
)

//go:embed static
var static embed.FS

// files is static/ as the root.
var files = func() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // static is embedded: only a broken build gets here
	}
	return sub
}()

// IndexFile is the page served at /.
const IndexFile = "index.html"

// ContentSecurityPolicy is the dashboard's CSP: this origin only, no
// inline script or style, no framing, no form posting anywhere.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Has reports whether name is one of the dashboard's files.
func Has(name string) bool {
	if name == "" || name == "." || path.Clean(name) != name {
		return false
	}
	info, err := fs.Stat(files, name)
	return err == nil && !info.IsDir()
}

// Serve writes the file name (which Has must accept) with its content
// type and the dashboard's security headers. The files change only with
// the binary: clients revalidate each load (no-cache) rather than keep a
// stale page after an upgrade.
func Serve(w http.ResponseWriter, name string) {
	data, err := fs.ReadFile(files, name)
	if err != nil {
		http.Error(w, "no such file", http.StatusNotFound)
		return
	}
	ctype := mime.TypeByExtension(path.Ext(name))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
}
