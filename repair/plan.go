package repair

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/internal/scan"
)

// Options says what PlanDuplicates scans and how it groups.
type Options struct {
	// Index is the index name N (the concrete indices behind N-write, or
	// behind N in the layout of older releases, are all scanned) or a
	// concrete index. Another filtered alias (such as N-read) is refused: it
	// hides tombstones and has no write index.
	Index string
	// Key is the grouping key: ["source_id"] (the default: the source_id
	// field, else _id), ["canonical_url"], or several fields forming a
	// business key. See ParseKey.
	Key []string
	// VersionField is the source field holding the business version;
	// "" means "version". See scan.Doc.Versioned for documents without it.
	VersionField string
	// UpdatedField breaks version ties; "" means "updated_at".
	UpdatedField string
	// PageSize of the scan; 0 means 1000.
	PageSize int
	// Progress, if set, counts scanned documents.
	Progress *progress.Bar
	// IncludeMissingKey groups documents that have no source_id field and
	// are outside the write index by their _id (key source_id, alone or in
	// a business key). By default they lack the key and are left alone:
	// their _id may be a legacy random one. In the write index the _id
	// stands for a missing source_id field, because that is where the sink
	// writes each source under _id = source_id.
	IncludeMissingKey bool
}

// Group is one key's planned repair.
type Group struct {
	Key    string     `json:"key"`
	Keeper scan.Doc   `json:"keeper"`
	Remove []scan.Doc `json:"remove,omitempty"` // deleted conditionally on _seq_no/_primary_term
	// Deleted: the keeper is a tombstone; the key stays deleted.
	Deleted bool `json:"deleted,omitempty"`
	// Rewrite: the keeper is written to (write index, TargetID) at its
	// Version with version_type=external_gte, because it is not there yet.
	Rewrite  bool   `json:"rewrite,omitempty"`
	TargetID string `json:"target_id"`
	// Version is what the rewrite writes the keeper at, and VersionReason
	// why: its business version, or the lowest version when it has none,
	// so that no event the outbox sends for the source is stale because of
	// a write count.
	Version       int64  `json:"version,omitempty"`
	VersionReason string `json:"version_reason,omitempty"`
	// Overwrites is the group's document at the target that the rewrite
	// replaces (backed up, not deleted); nil when the rewrite creates it.
	Overwrites *scan.Doc `json:"overwrites,omitempty"`
	Reason     string    `json:"reason"`
	// Conflict, when set, is why the group is left alone (e.g. its target
	// _id holds a document of another key).
	Conflict string `json:"conflict,omitempty"`
}

// Plan is the outcome of a scan: what Apply would do. Only groups
// that need work are kept.
type Plan struct {
	Index        string   `json:"index"`
	WriteAlias   string   `json:"write_alias"`
	WriteIndex   string   `json:"write_index"`
	Indices      []string `json:"indices"`
	Key          []string `json:"key"`
	UpdatedField string   `json:"updated_field"`
	Scanned      int64    `json:"scanned"`
	Keys         int64    `json:"keys"`
	Ungroupable  int64    `json:"ungroupable"` // documents missing the key: left alone
	// KeyedByID counts documents grouped by _id for lack of a source_id
	// field (Options.IncludeMissingKey).
	KeyedByID         int64   `json:"keyed_by_id"`
	IncludeMissingKey bool    `json:"include_missing_key"`
	Groups            []Group `json:"groups"`
}

// PlanDuplicates scans every concrete index behind opts.Index and plans the
// repair. It changes nothing.
//
// Memory: per document only a scan.Doc (coordinates, version, updated-at)
// is kept while grouping; groups that need no work are dropped when the
// scan ends. Sources are never held.
//
// A group needs work when it holds more than one document, or when its
// only document is not at _id = source_id in the write index (a legacy
// random _id, or a copy left in an older index): a later outbox event
// would otherwise create a second copy beside it.
//
// Documents without the key (see Options.IncludeMissingKey) are
// counted as Ungroupable and never written: a rewrite whose new _id holds
// one is a conflict.
func PlanDuplicates(ctx context.Context, es *elasticsearch.Client, opts Options) (*Plan, error) {
	if opts.Index == "" {
		return nil, fmt.Errorf("indexer: repair: index: must not be empty")
	}
	if len(opts.Key) == 0 {
		opts.Key = []string{"source_id"}
	}
	if opts.VersionField == "" {
		opts.VersionField = "version"
	}
	if opts.UpdatedField == "" {
		opts.UpdatedField = "updated_at"
	}
	keyHasSourceID := slices.Contains(opts.Key, "source_id")
	if opts.IncludeMissingKey && !keyHasSourceID {
		return nil, fmt.Errorf("indexer: repair: include_missing_key: only a key with source_id can fall back to _id; documents without %s have nothing to group by", strings.Join(opts.Key, ","))
	}
	indices, writeIndex, err := scan.Resolve(ctx, es, opts.Index)
	if err != nil {
		return nil, err
	}
	plan := &Plan{Index: opts.Index, WriteAlias: opts.Index, WriteIndex: writeIndex, Indices: indices, Key: opts.Key, UpdatedField: opts.UpdatedField, IncludeMissingKey: opts.IncludeMissingKey}
	if n, err := scan.Count(ctx, es, indices); err == nil {
		opts.Progress.SetTotal(n)
	}

	groups := newGrouper()
	err = scan.Each(ctx, es, scan.Options{
		Indices:        indices,
		SourceIncludes: scan.Fields(opts.Key, opts.VersionField, opts.UpdatedField),
		PageSize:       opts.PageSize,
		Progress:       opts.Progress,
		Refresh:        true,
	}, func(h scan.Hit) error {
		plan.Scanned++
		k, d, ok, err := scan.Key(h, opts.Key, opts.VersionField, opts.UpdatedField)
		if err != nil {
			return err
		}
		if ok && d.IDSource && keyHasSourceID && d.Index != writeIndex {
			ok = opts.IncludeMissingKey
			if ok {
				plan.KeyedByID++
			}
		}
		if !ok {
			plan.Ungroupable++
			return nil
		}
		d.Versioned = d.Versioned || (d.Index == writeIndex && d.ID == d.SourceID)
		groups.add(k, d)
		return nil
	})
	if err != nil {
		return nil, err
	}
	plan.Keys = int64(len(groups.slots))

	targets := map[string]int{} // target _id -> group index, for conflict checks
	groups.each(writeIndex, func(k string, docs []scan.Doc) {
		g, needed := planGroup(k, docs, writeIndex, opts.UpdatedField)
		if !needed {
			return
		}
		if g.Rewrite {
			if other, dup := targets[g.TargetID]; dup {
				g.Conflict = fmt.Sprintf("target _id %q is also the target of group %q", g.TargetID, plan.Groups[other].Key)
				if plan.Groups[other].Conflict == "" {
					plan.Groups[other].Conflict = fmt.Sprintf("target _id %q is also the target of group %q", g.TargetID, k)
				}
			} else {
				targets[g.TargetID] = len(plan.Groups)
			}
		}
		plan.Groups = append(plan.Groups, g)
	})
	// A rewrite must not overwrite a document that belongs to another key
	// (possible with canonical_url or business keys: one source_id, two
	// URLs). One pass over the grouped documents finds them.
	if len(targets) > 0 {
		groups.eachDoc(func(k, index, id string) {
			if index != writeIndex {
				return
			}
			if gi, hit := targets[id]; hit && plan.Groups[gi].Key != k && plan.Groups[gi].Conflict == "" {
				plan.Groups[gi].Conflict = fmt.Sprintf("target %s/%s holds a document of another key (%q); repair by source_id first", writeIndex, id, k)
			}
		})
	}
	if plan.Ungroupable > 0 {
		if err := checkFreeTargets(ctx, es, plan); err != nil {
			return nil, err
		}
	}
	sort.Slice(plan.Groups, func(i, j int) bool { return plan.Groups[i].Key < plan.Groups[j].Key })
	return plan, nil
}

// checkFreeTargets marks as conflicts the rewrites whose new _id is
// taken by a document the scan left ungrouped (it lacks the key): the
// rewrite would replace a document the repair must leave alone.
func checkFreeTargets(ctx context.Context, es *elasticsearch.Client, plan *Plan) error {
	var refs []docRef
	var at []int
	check := func() error {
		got, err := mget(ctx, es, refs, false)
		if err != nil {
			return fmt.Errorf("indexer: repair: %w", err)
		}
		for i, r := range refs {
			if got[r].Found {
				plan.Groups[at[i]].Conflict = fmt.Sprintf("target %s/%s holds a document without the key (left alone)", r.index, r.id)
			}
		}
		refs, at = refs[:0], at[:0]
		return nil
	}
	for i, g := range plan.Groups {
		if !g.Rewrite || g.Overwrites != nil || g.Conflict != "" {
			continue
		}
		refs = append(refs, docRef{plan.WriteIndex, g.TargetID})
		at = append(at, i)
		if len(refs) == 1000 {
			if err := check(); err != nil {
				return err
			}
		}
	}
	return check()
}

// planGroup decides one group; needed is false when it is already
// one document at its canonical place.
func planGroup(key string, docs []scan.Doc, writeIndex, updatedField string) (Group, bool) {
	keeper, others, deleted, reason := chooseKeeper(docs, writeIndex, updatedField)
	g := Group{Key: key, Keeper: keeper, Deleted: deleted, Reason: reason, TargetID: keeper.SourceID}
	inPlace := keeper.Index == writeIndex && keeper.ID == keeper.SourceID
	if !inPlace {
		g.Rewrite = true
		// The keeper moves; its old copy goes with the others.
		others = append(others, keeper)
	}
	for _, d := range others {
		if g.Rewrite && d.Index == writeIndex && d.ID == g.TargetID && !(d.Index == keeper.Index && d.ID == keeper.ID) {
			d := d
			g.Overwrites = &d
			continue
		}
		g.Remove = append(g.Remove, d)
	}
	if len(g.Remove) == 0 && !g.Rewrite {
		return g, false
	}
	if len(docs) == 1 {
		g.Reason = "single document not at _id = source_id in the write index; moved there"
	}
	if g.Rewrite {
		g.Version, g.VersionReason = keeper.Version, "its business version"
		if !keeper.Versioned {
			// Only a business version may raise the gate: a write count
			// above the application's versions would make its next
			// updates stale. The ranking puts business versions first,
			// so a keeper without one has no versioned copy beside it.
			g.Version = 1
			g.VersionReason = fmt.Sprintf("no copy has a business version (_version %d counts writes), so the lowest: every event the outbox sends for it applies", keeper.ESVersion)
		}
	}
	if g.Overwrites != nil && g.Overwrites.ESVersion > g.Version {
		// external_gte would refuse the rewrite (typical of legacy internal
		// versions); forcing a higher version would make later outbox
		// events stale, so the operator decides.
		g.Conflict = fmt.Sprintf("target %s/%s holds _version %d, above the keeper's version %d", writeIndex, g.TargetID, g.Overwrites.ESVersion, g.Version)
	}
	return g, true
}
