package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/internal/source"
	"github.com/outboxd/outboxd/outbox"
)

// Options says what Run reads and where it writes.
type Options struct {
	Pool   *pgxpool.Pool
	Schema string // the outbox schema, which holds the backfills table
	// Sink is where the rows go, as events: an *indexer.Sink, or anything
	// with its Write. Build an *indexer.Sink with indexer.Options.JSONB
	// when ValidJSON says PostgreSQL validated the documents.
	Sink interface {
		Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error)
	}
	// Index is the index name N the rows are written to, as events of N.
	Index string
	// SourceSQL returns id, version (bigint >= 1) and document (a JSON
	// object), and optionally a fourth boolean column: true writes a delete
	// (a tombstone at that version) instead of the document. It runs in a
	// read-only transaction and is ordered by id by Run itself, in the
	// id's own type: return a table's key column as it is (not id::text)
	// and the rows are read in the order of its index, without a sort. The
	// id's text is the document's _id.
	//
	// Empty for a definition-fed index (package documents): every
	// document of its definition is loaded instead, the ids of its ids
	// query read in batches by documents.Reader, each batch at the
	// version of its read (see internal/source.Definition). A
	// definition-fed index refuses a SourceSQL, and an index without a
	// definition needs one.
	SourceSQL string
	// Restart starts over even when an interrupted backfill of Index could
	// be continued.
	Restart bool
	Batch   int // rows per Sink.Write at most; default 4000
	// BatchBytes bounds a batch by the bytes of its ids and documents too,
	// whatever a row weighs (a row larger alone is a batch of its own);
	// default 8 MiB. Memory holds InFlight + 1 batches and one row.
	BatchBytes    int
	InFlight      int           // batches at the sink at once; default 2
	MaxAttempts   int           // tries of an event answered Retry; default 10
	SourceTimeout time.Duration // statement timeout of each FETCH; default 10m
	OutageTimeout time.Duration // how long a whole-sink outage is waited out; default 5m
	Progress      *progress.Bar
	Logger        *slog.Logger // nil discards

	// afterStore, when set, is called after each batch's progress is
	// stored, with the count of batches stored: tests interrupt a run at
	// a known batch through it.
	afterStore func(batches int)

	def *documents.Definition // the index's definition, looked up by Run
}

// Report is what Run did.
type Report struct {
	Index    string          `json:"index"`
	From     string          `json:"resumed_after,omitempty"`
	Rows     int64           `json:"rows"`
	Applied  int64           `json:"applied"`
	Stale    int64           `json:"stale"`
	Rejected int64           `json:"rejected"`
	Samples  []source.Reject `json:"rejected_samples,omitempty"`
	Seconds  float64         `json:"seconds"`
}

// Run streams the rows of SourceSQL straight to the sink as versioned
// upserts, without appending outbox events, while the relay may be
// delivering live events of the same index: the version gate decides, so a
// row older than a live event is stale and a row deleted after it was read
// stays deleted (its delete carries a higher version). Rows are read in
// id order through a server-side cursor, InFlight batches are at the sink
// at once, and after each batch that the sink answered, in order, the
// last id is stored: a backfill killed at any point continues from there
// (rows after it are sent again, which the gate makes harmless). One run
// of an index at a time: a second one is refused, naming the running one.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if err := o.lookup(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	st, err := openBackfillState(ctx, o)
	if err != nil {
		return nil, err
	}
	defer st.close()
	rep := &Report{Index: o.Index, From: st.after}
	if st.after != "" {
		o.Logger.Info("backfill resumed", "index", o.Index, "after", st.after)
	}

	conn, err := o.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("indexer: backfill: %w", err)
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("indexer: backfill: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rd, err := o.open(ctx, tx, st.after)
	if err != nil {
		return nil, err
	}
	write := o.Sink.Write

	// The reader fills the next batch while InFlight earlier ones are at
	// the sink (a slot each: more would only hold more memory); results
	// are taken in reading order, so the stored key only ever covers rows
	// the sink answered for.
	type pending struct {
		last     string
		rows     int
		rejected []source.Reject // before the sink
		done     chan batchResult
	}
	slots := make(chan struct{}, o.InFlight)
	queue := make(chan pending, o.InFlight)
	readErr := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	reading := make(chan struct{})
	// Before the deferred rollback: the reader must be off the connection.
	defer func() { cancel(); <-reading }()
	go func() {
		defer close(reading)
		defer close(queue)
		defer rd.Close()
		for {
			b, err := rd.Next(rctx)
			if err != nil || b.Rows == 0 {
				readErr <- err
				return
			}
			select {
			case slots <- struct{}{}:
			case <-rctx.Done():
				readErr <- rctx.Err()
				return
			}
			p := pending{last: b.Last, rows: b.Rows, rejected: b.Rejected, done: make(chan batchResult, 1)}
			go func() { p.done <- sendBackfill(rctx, o, write, b.Events) }()
			queue <- p // never blocks: a slot is taken
		}
	}()
	stored := 0
	for p := range queue {
		if err := ctx.Err(); err != nil {
			// Stopped: what the sink answered since is sent again next
			// time, which the gate makes harmless.
			cancel()
			return rep, err
		}
		r := <-p.done
		<-slots
		if r.err != nil {
			cancel()
			return rep, r.err
		}
		r.rejected = append(p.rejected, r.rejected...)
		if err := st.store(ctx, p.last, int64(p.rows), r); err != nil {
			cancel()
			return rep, err
		}
		rep.Rows += int64(p.rows)
		rep.Applied += r.applied
		rep.Stale += r.stale
		rep.Rejected += int64(len(r.rejected))
		for _, rj := range r.rejected {
			if len(rep.Samples) < 20 {
				rep.Samples = append(rep.Samples, rj)
			}
		}
		o.Progress.Add(int64(p.rows))
		if stored++; o.afterStore != nil {
			o.afterStore(stored)
		}
	}
	if err := <-readErr; err != nil {
		return rep, err
	}
	if err := st.finish(ctx); err != nil {
		return rep, err
	}
	rep.Seconds = time.Since(start).Seconds()
	o.Logger.Info("backfill finished", "index", o.Index, "rows", rep.Rows, "applied", rep.Applied, "stale", rep.Stale, "rejected", rep.Rejected)
	return rep, nil
}

func (o *Options) defaults() error {
	switch {
	case o.Pool == nil:
		return errors.New("indexer: backfill: pool: no PostgreSQL pool")
	case o.Sink == nil:
		return errors.New("indexer: backfill: sink: no sink")
	}
	if err := indexer.CheckName(o.Index); err != nil {
		return err
	}
	if o.Batch <= 0 {
		o.Batch = 4000
	}
	if o.BatchBytes <= 0 {
		o.BatchBytes = 8 << 20
	}
	if o.InFlight <= 0 {
		o.InFlight = 2
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 10
	}
	if o.SourceTimeout <= 0 {
		o.SourceTimeout = 10 * time.Minute
	}
	if o.OutageTimeout <= 0 {
		o.OutageTimeout = 5 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// lookup finds Index's definition and refuses what cannot be loaded: a
// definition-fed index with a SourceSQL (its documents come from its
// definition, at read versions), one without either, or a definition
// without an ids query.
func (o *Options) lookup(ctx context.Context) error {
	def, err := documents.Lookup(ctx, o.Pool, o.Schema, o.Index)
	if err != nil {
		return fmt.Errorf("indexer: backfill: %w", err)
	}
	switch given := strings.TrimSpace(o.SourceSQL) != ""; {
	case def == nil && !given:
		return fmt.Errorf("indexer: backfill: source_sql: required: index %s has no document definition to load its documents from (outboxd documents define --index %s), so the query returning its rows must be given", o.Index, o.Index)
	case def != nil && given:
		return fmt.Errorf("indexer: backfill: source_sql: index %s is definition-fed: its documents come from its definition, at the versions of their reads; leave source_sql out to load them from it", o.Index)
	case def != nil:
		if err := def.NeedIDs(); err != nil {
			return fmt.Errorf("indexer: backfill: %w", err)
		}
	}
	o.def = def
	return nil
}

// batches reads a backfill's source in batches: rows of SourceSQL, or
// documents of the definition.
type batches interface {
	Next(ctx context.Context) (source.Batch, error)
	Close()
}

// open opens the cursor after key after and returns its batches, with
// the progress bar's total set to the planner's estimate.
func (o *Options) open(ctx context.Context, tx pgx.Tx, after string) (batches, error) {
	if o.def == nil {
		if err := source.Declare(ctx, tx, o.query(), after); err != nil {
			return nil, err
		}
		if o.Progress != nil {
			o.Progress.SetTotal(source.Estimate(ctx, tx, o.SourceSQL))
		}
		return source.NewReader(tx, o.query()), nil
	}
	reader, err := documents.NewReader(o.Pool, o.Schema, o.SourceTimeout)
	if err != nil {
		return nil, fmt.Errorf("indexer: backfill: %w", err)
	}
	if err := source.DeclareIDs(ctx, tx, o.def.IDsSQL, o.SourceTimeout, after); err != nil {
		return nil, fmt.Errorf("indexer: backfill: index %s: %w", o.Index, err)
	}
	if o.Progress != nil {
		o.Progress.SetTotal(source.Estimate(ctx, tx, o.def.IDsSQL))
	}
	return source.NewDefinition(tx, reader, o.query()), nil
}

// sourceKey is what the progress row's hash identifies: the query, or
// the definition and its ids query.
func (o *Options) sourceKey() string {
	if o.def != nil {
		return source.DefinitionHash(o.def)
	}
	return o.SourceSQL
}

// query is what the source reader needs of o.
func (o *Options) query() source.Query {
	return source.Query{SourceSQL: o.SourceSQL, Index: o.Index, Batch: o.Batch, BatchBytes: o.BatchBytes, SourceTimeout: o.SourceTimeout}
}

type batchResult struct {
	applied, stale int64
	rejected       []source.Reject
	err            error
}

// sendBackfill writes one batch, retrying transient failures: whole-sink
// outages up to OutageTimeout, each event answered Retry up to
// MaxAttempts, after which it is reported with the rejected rows. Rows
// with a bad id, version or document are rejected by the sink with the
// reason, like events.
func sendBackfill(ctx context.Context, o Options, write func(context.Context, []outbox.Event) ([]outbox.Outcome, error), events []outbox.Event) batchResult {
	var r batchResult
	outageSince := time.Time{}
	for attempt, delay := 1, 100*time.Millisecond; len(events) > 0; attempt++ {
		out, err := write(ctx, events)
		var again []outbox.Event
		if err == nil {
			for i, oc := range out {
				switch {
				case oc.Status == outbox.Applied:
					r.applied++
				case oc.Status == outbox.Stale:
					r.stale++
				case oc.Status == outbox.Rejected || (!oc.Outage && attempt >= o.MaxAttempts):
					r.rejected = append(r.rejected, source.Reject{ID: events[i].SourceID, Reason: oc.Reason})
				default:
					again = append(again, events[i])
				}
			}
			outageSince = time.Time{}
		} else {
			again = events
			if outageSince.IsZero() {
				outageSince = time.Now()
			}
			if time.Since(outageSince) > o.OutageTimeout {
				r.err = fmt.Errorf("indexer: backfill: the sink has been unavailable for %s: %w", o.OutageTimeout, err)
				return r
			}
			o.Logger.Warn("backfill: sink unavailable, retrying", "error", err.Error())
		}
		events = again
		if len(events) == 0 {
			break
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			r.err = ctx.Err()
			return r
		}
		delay = min(2*delay, 5*time.Second)
	}
	return r
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
