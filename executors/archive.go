package executors

import (
	"context"

	"github.com/sbxlog/sbxlog/fsm"
)

// archiveCall adapts an Archiver method to the dispatch table: a driver
// without an archive store fails the intent for good (an archive intent
// can only come from a node that had one, configured away since).
func archiveCall[I fsm.Intent](call func(Archiver, context.Context, I) (Result, error)) func(Driver, context.Context, I) (Result, error) {
	return func(d Driver, ctx context.Context, in I) (Result, error) {
		if a, ok := d.(Archiver); ok {
			return call(a, ctx, in)
		}
		return Result{}, Unrecoverablef("%s %s: this node has no archive store (archive_dir)", in.Kind(), in.Subject())
	}
}
