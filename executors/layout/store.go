package layout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbxlog/sbxlog/executors"
	"github.com/sbxlog/sbxlog/executors/fsx"
)

// StoreDirs are the store's snapshot directories, each holding snapshot
// dirs as direct children. Collection and the start-up sweep act only on
// entries of these; a new kind of snapshot (checkpoints, archives) adds its
// directory here.
var StoreDirs = []string{GoldenStore, HibernateStore}

// StoreEntry resolves a snapshot dir of the store for removal: a direct
// child of one of StoreDirs, with SnapshotDir's checks. Anything else can
// only come from a corrupt intent (Unrecoverable).
func (r Roots) StoreEntry(rel string) (string, error) {
	dir, err := r.SnapshotDir(rel)
	if err != nil {
		return "", err
	}
	for _, sub := range StoreDirs {
		if filepath.Dir(dir) == filepath.Join(r.Store, sub) {
			return dir, nil
		}
	}
	return "", executors.Unrecoverablef("snapshot dir %q is not in one of the store's snapshot directories %v", rel, StoreDirs)
}

// MetaFile is the name of every snapshot's metadata file, whichever driver
// wrote it.
const MetaFile = "meta.json"

// SnapshotOwner is what every driver's meta.json says about who made the
// snapshot: the instance and the intent op.
type SnapshotOwner struct {
	Instance string `json:"instance"`
	Op       string `json:"op"`
}

// ReadOwner reads the owner fields of the snapshot in dir; ok is false when
// it has no readable meta.json.
func ReadOwner(dir string) (SnapshotOwner, bool) {
	var o SnapshotOwner
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil || json.Unmarshal(b, &o) != nil {
		return SnapshotOwner{}, false
	}
	return o, true
}

// StoreSweep is what UnreferencedSnapshots found: entries to remove, and
// entries it leaves because another instance (or no known one) made them.
type StoreSweep struct {
	// Stale entries (relative to the store) this instance made that
	// nothing references: remove them.
	Stale []string
	// Foreign entries another instance made, and Unknown ones whose
	// meta.json names none (written before snapshots recorded their
	// instance) or is missing: kept, reported.
	Foreign, Unknown []string
}

// UnreferencedSnapshots lists the entries of the store's snapshot
// directories other than HibernateStore (whose stale entries the hibernate
// sweep finds by name) that keep does not keep: keep says whether the
// state references an entry (relative to the store) or an intent in flight
// is making it (the op of its meta.json). Only entries whose meta.json names
// instance are stale; the rest are Foreign or Unknown and never removed.
func (r Roots) UnreferencedSnapshots(instance string, keep func(rel, op string) bool) (StoreSweep, error) {
	var out StoreSweep
	for _, sub := range StoreDirs {
		if sub == HibernateStore {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(r.Store, sub))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("layout: %w", err)
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			rel := filepath.Join(sub, e.Name())
			o, ok := ReadOwner(filepath.Join(r.Store, rel))
			switch {
			case keep(rel, o.Op):
			case !ok || o.Instance == "":
				out.Unknown = append(out.Unknown, rel)
			case o.Instance != instance:
				out.Foreign = append(out.Foreign, rel)
			default:
				out.Stale = append(out.Stale, rel)
			}
		}
	}
	return out, nil
}

// Collect removes the store entry rel (StoreEntry) through fsys,
// crash-safely and idempotently under id (fsx.Discard): the removal of a
// collect intent, whichever driver runs it.
func (r Roots) Collect(fsys fsx.FS, rel, id string) error {
	dir, err := r.StoreEntry(rel)
	if err != nil {
		return err
	}
	return fsx.Discard(fsys, r.Store, dir, id)
}

// SweepStore removes through fsys the entries UnreferencedSnapshots finds
// stale, and returns what it found: the start-up sweep of every driver.
func (r Roots) SweepStore(ctx context.Context, fsys fsx.FS, instance string, keep func(rel, op string) bool) (StoreSweep, error) {
	sw, err := r.UnreferencedSnapshots(instance, keep)
	if err != nil {
		return sw, err
	}
	for _, rel := range sw.Stale {
		if ctx.Err() != nil {
			return sw, ctx.Err()
		}
		if err := r.Collect(fsys, rel, "sweep-"+filepath.Base(rel)); err != nil {
			return sw, err
		}
	}
	return sw, nil
}
