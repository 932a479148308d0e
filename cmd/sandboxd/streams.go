package main

import (
	"context"
	"net/http"
)

// streamsPath is the API's one route whose answers never end by themselves
// (Server-Sent Events, both views).
const streamsPath = "/v1/events"

// endStreamsOn ends the event streams h serves once stop is done. Without
// it http.Server.Shutdown waits its whole timeout for them on every SIGTERM
// while a client follows the log; their clients resume by cursor. Other
// requests are left to finish.
func endStreamsOn(stop context.Context, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == streamsPath {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			defer context.AfterFunc(stop, cancel)()
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	})
}
