package admin

import (
	_ "embed"
	"net/http"
)

// dashboard is the whole page: markup, style and script in one file, so
// it works on machines without internet access.
//
//go:embed dashboard.html
var dashboard []byte

func (s *Server) page(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// Nothing on the page comes from elsewhere; say so to the browser.
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src 'self' data:")
	_, _ = w.Write(dashboard)
}
