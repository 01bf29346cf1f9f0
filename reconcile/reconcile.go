package reconcile

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/internal/scan"
	"github.com/outboxd/outboxd/internal/source"
	"github.com/outboxd/outboxd/outbox"
)

// Drift kinds reported by Run.
const (
	DriftMissing     = "missing"     // live in the source, not visible in the index
	DriftStale       = "stale"       // visible at a lower version than the source's
	DriftExtra       = "extra"       // visible in the index, no source row
	DriftResurrected = "resurrected" // deleted in the source, visible in the index
	DriftDuplicate   = "duplicate"   // several live documents for one source_id
	DriftAhead       = "ahead"       // visible at a higher version than the source's, with other content
)

// DefaultSourceTimeout is how long reconcile's source SQL may run by default.
const DefaultSourceTimeout = 5 * time.Minute

// Options configures Run.
type Options struct {
	ES *elasticsearch.Client
	DB *pgxpool.Pool
	// Schema is the outbox schema fixes are appended to.
	Schema string
	// Index is the write alias N: the index_name of the fix events. Every
	// concrete index behind it is scanned, tombstones included.
	Index string
	// SourceSQL returns the database's truth, one row per source:
	// source_id (text), version (integer), document (json/jsonb/text),
	// and optionally a fourth boolean column "deleted". A row whose
	// document is NULL, or whose deleted column is true, means "deleted in
	// the source at this version". Sources absent from the result are not
	// in the source at all.
	//
	// Empty for a definition-fed index (package documents): its
	// definition is the truth, compared document by document (see
	// definition.go), and drift is fixed by refresh events. A
	// definition-fed index refuses a SourceSQL, and an index without a
	// definition needs one.
	SourceSQL string
	// VersionField, for legacy indexes only, names the document field that
	// holds a document's version. Empty (the default) compares _version,
	// which is the event's version for every document outboxd wrote
	// (external versioning); a field of the same name in a document is
	// then just data.
	VersionField string
	// SourceTimeout bounds SourceSQL, which runs in a READ ONLY
	// transaction with this statement_timeout, so a query that writes or
	// runs away is refused instead of changing or holding the database;
	// 0 means DefaultSourceTimeout.
	SourceTimeout time.Duration
	// Apply appends fix events to the outbox (see Run).
	Apply bool
	// Sample is the number of samples kept per kind; 0 means 10.
	Sample int
	// Operator is recorded in <schema>.audit_log for applied fixes.
	Operator string
	// Batch is the number of fix events per transaction; 0 means 500.
	Batch    int
	Progress *progress.Bar

	def *documents.Definition // the index's definition, looked up by Run
}

// DriftSample is one example of a drift.
type DriftSample struct {
	Kind          string `json:"kind"`
	SourceID      string `json:"source_id"`
	SourceVersion int64  `json:"source_version,omitempty"`
	IndexVersion  int64  `json:"index_version,omitempty"`
	LiveDocs      int    `json:"live_docs,omitempty"`
	Fix           string `json:"fix"`
}

// Report is the outcome of Run.
type Report struct {
	Index      string   `json:"index"`
	Indices    []string `json:"indices"`
	IndexDocs  int64    `json:"index_docs"`
	IndexKeys  int64    `json:"index_keys"`
	SourceRows int64    `json:"source_rows"`
	// Counts per drift kind (every kind is present, zero or not).
	Counts  map[string]int64         `json:"counts"`
	Samples map[string][]DriftSample `json:"samples"`
	// NeedsRepair counts drifts an outbox event cannot fix because the
	// visible copy is not at _id = source_id in the write index; run
	// `outboxd repair` first.
	NeedsRepair int64 `json:"needs_repair"`
	Applied     bool  `json:"applied"`
	Events      int64 `json:"events"` // fix events appended (or that --apply would append)
	// Rejected lists source rows whose fix cannot be appended (a document
	// with a reserved field); the other fixes go on.
	Rejected []source.Reject `json:"rejected,omitempty"`
}

// Drifted reports whether any drift was found.
func (r *Report) Drifted() bool {
	for _, n := range r.Counts {
		if n > 0 {
			return true
		}
	}
	return false
}

// reconState is what Run keeps per source_id of the index: a few
// numbers, never a source.
type reconState struct {
	canonVersion int64 // _version at (write index, _id = source_id); 0 if none
	maxLive      int64 // highest ranked version among live copies
	live         int32
	liveOff      int32 // live copies elsewhere (random _id, older index)
	seen         bool
}

// Run compares the database's truth (SourceSQL) with every document
// behind Index and reports missing, stale, extra, resurrected, duplicate
// and ahead documents, with counts and samples. A document's version is its
// _version, which outboxd sets to the event's version; VersionField reads
// it from the document instead, for indexes written by something else.
//
// The index is scanned first into per-source_id state (a few integers per
// key), then the SQL result is streamed against it, so memory grows with
// the number of keys, not documents' size. A row written while it
// runs may show up as missing or stale; the fix is then a harmless
// duplicate event that the version gate absorbs.
//
// With Apply, each fixable drift becomes an outbox event, appended in
// batches of Batch in one transaction each, so fixes take the same
// versioned path as every other write:
//
//   - missing, stale: upsert of the source's document at
//     max(source version, _version at _id = source_id). Equal wins under
//     external_gte, so the event overwrites a tombstone or copy at the same
//     version, and never loses to what the index holds.
//   - resurrected: delete at max(source version, _version + 1).
//   - extra: delete at _version + 1: there is no source version, and it
//     must be strictly newer than the copy it hides.
//   - ahead: upsert of the source's document at the index's version + 1.
//     The index holds a version the database does not (after a PostgreSQL
//     failover with asynchronous replication, events the relay delivered
//     from the old primary were never replicated to the new one); the
//     database is the truth, so its row is appended again, above what the
//     index holds. A document ahead with the source's content (a fix that
//     had to pass a tombstone's version) is not drift.
//
// The outbox's versions counter is raised to each fix's version in the
// same transaction, so a later auto-versioned event of that source still
// wins (after a failover it would otherwise reuse versions the index has
// already seen, and lose the version gate). Duplicates and drifts whose
// visible copy is not at _id = source_id in the write index are reported,
// not fixed: an event only ever addresses _id = source_id; `outboxd
// repair` handles the rest.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := opts.lookup(ctx); err != nil {
		return nil, err
	}
	ob, err := outbox.NewOutbox(opts.Schema)
	if err != nil {
		return nil, fmt.Errorf("indexer: reconcile: %w", err)
	}
	indices, writeIndex, err := scan.Resolve(ctx, opts.ES, opts.Index)
	if err != nil {
		return nil, err
	}
	rep := &Report{Index: opts.Index, Indices: indices, Counts: map[string]int64{}, Samples: map[string][]DriftSample{}, Applied: opts.Apply}
	for _, k := range []string{DriftMissing, DriftStale, DriftExtra, DriftResurrected, DriftDuplicate, DriftAhead} {
		rep.Counts[k] = 0
	}
	states, err := scanStates(ctx, opts, indices, writeIndex, rep)
	if err != nil {
		return nil, err
	}
	rep.IndexKeys = int64(len(states))

	fx := &reconFixer{opts: opts, ob: ob, rep: rep}
	if opts.def != nil {
		if err := fx.definition(ctx, states, writeIndex); err != nil {
			return nil, err
		}
	} else {
		if err := fx.source(ctx, states, writeIndex); err != nil {
			return nil, err
		}
		if err := fx.extra(ctx, states); err != nil {
			return nil, err
		}
	}
	if err := fx.flush(ctx); err != nil {
		return nil, err
	}
	return rep, nil
}

func (opts *Options) defaults() error {
	switch {
	case opts.ES == nil:
		return fmt.Errorf("indexer: reconcile: es: no Elasticsearch client")
	case opts.DB == nil:
		return fmt.Errorf("indexer: reconcile: db: no PostgreSQL pool")
	case opts.Index == "":
		return fmt.Errorf("indexer: reconcile: index: must not be empty")
	case strings.HasPrefix(opts.VersionField, "_"):
		return fmt.Errorf("indexer: reconcile: version_field: %q is a metadata field; leave it empty to compare _version", opts.VersionField)
	}
	if opts.Sample <= 0 {
		opts.Sample = 10
	}
	if opts.SourceTimeout <= 0 {
		opts.SourceTimeout = DefaultSourceTimeout
	}
	if opts.Batch <= 0 {
		opts.Batch = 500
	}
	if opts.Operator == "" {
		opts.Operator = "outboxd reconcile"
	}
	return nil
}

// lookup finds Index's definition and refuses what cannot be compared: a
// definition-fed index with a SourceSQL or a VersionField (its truth is
// its definition, its versions those of reads), one without either, or a
// definition without an ids query.
func (opts *Options) lookup(ctx context.Context) error {
	def, err := documents.Lookup(ctx, opts.DB, opts.Schema, opts.Index)
	if err != nil {
		return fmt.Errorf("indexer: reconcile: %w", err)
	}
	switch given := strings.TrimSpace(opts.SourceSQL) != ""; {
	case def == nil && !given:
		return fmt.Errorf("indexer: reconcile: source_sql: required: index %s has no document definition to compare it with (outboxd documents define --index %s), so the query returning the database's truth must be given", opts.Index, opts.Index)
	case def != nil && given:
		return fmt.Errorf("indexer: reconcile: source_sql: index %s is definition-fed: its definition is the truth it is compared with; leave source_sql out", opts.Index)
	case def != nil && opts.VersionField != "":
		return fmt.Errorf("indexer: reconcile: version_field: index %s is definition-fed: its versions are those of the definition's reads, in _version", opts.Index)
	case def != nil:
		if err := def.NeedIDs(); err != nil {
			return fmt.Errorf("indexer: reconcile: %w", err)
		}
	}
	opts.def = def
	return nil
}

// scanStates reads what the index holds per source_id.
func scanStates(ctx context.Context, opts Options, indices []string, writeIndex string, rep *Report) (map[string]reconState, error) {
	if n, err := scan.Count(ctx, opts.ES, indices); err == nil {
		opts.Progress.SetTotal(n)
	}
	states := map[string]reconState{}
	err := scan.Each(ctx, opts.ES, scan.Options{Indices: indices, SourceIncludes: scan.Fields(nil, opts.VersionField, ""), Progress: opts.Progress, Refresh: true}, func(h scan.Hit) error {
		rep.IndexDocs++
		sid, d, _, err := scan.Key(h, []string{"source_id"}, opts.VersionField, "")
		if err != nil {
			return err
		}
		st := states[sid]
		canonical := d.Index == writeIndex && d.ID == sid
		if canonical {
			st.canonVersion = d.ESVersion
		}
		if !d.Tombstone {
			st.live++
			if !canonical {
				st.liveOff++
			}
			if d.Version > st.maxLive {
				st.maxLive = d.Version
			}
		}
		states[sid] = st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("indexer: reconcile: %w", err)
	}
	return states, nil
}

// note counts one drift and keeps it as a sample.
func (f *reconFixer) note(kind, sid string, srcV int64, st reconState, fix string) {
	f.rep.Counts[kind]++
	if len(f.rep.Samples[kind]) < f.opts.Sample {
		f.rep.Samples[kind] = append(f.rep.Samples[kind], DriftSample{Kind: kind, SourceID: sid, SourceVersion: srcV, IndexVersion: st.maxLive, LiveDocs: int(st.live), Fix: fix})
	}
}

// extra notes (and queues deletes for) what the source did not mention
// and is still visible.
func (f *reconFixer) extra(ctx context.Context, states map[string]reconState) error {
	// Whatever the source did not mention and is still visible is extra.
	// Sorted, so samples and events are deterministic.
	var extra []string
	for sid, st := range states {
		if !st.seen && st.live > 0 {
			extra = append(extra, sid)
		}
	}
	sort.Strings(extra)
	for _, sid := range extra {
		st := states[sid]
		if st.liveOff > 0 {
			f.note(DriftExtra, sid, 0, st, "needs repair: a visible copy is not at _id = source_id")
			f.rep.NeedsRepair++
			continue
		}
		at := st.canonVersion + 1
		f.note(DriftExtra, sid, 0, st, fmt.Sprintf("delete at version %d", at))
		if err := f.add(ctx, outbox.Event{IndexName: f.opts.Index, SourceID: sid, Version: at, Op: outbox.OpDelete}); err != nil {
			return err
		}
	}
	return nil
}
