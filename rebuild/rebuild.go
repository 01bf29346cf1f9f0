package rebuild

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/internal/scan"
	"github.com/outboxd/outboxd/internal/source"
)

// Rebuild phases, as stored in the rebuilds table.
const (
	PhaseCopying    = "copying"
	PhaseCatchingUp = "catching_up"
	PhaseSwapped    = "swapped"
	PhaseDone       = "done"
	PhaseAborted    = "aborted"
)

// Options says which index is rebuilt, into what, and from where.
type Options struct {
	Pool   *pgxpool.Pool
	Schema string // the outbox schema, which holds the rebuilds table
	ES     *elasticsearch.Client
	// Index is the index name N; the concrete index behind N-write is
	// rebuilt into the next one (N-000002 after N-000001, ...).
	Index string
	// Mappings and Settings of the new index (JSON objects, optionally
	// wrapped as {"mappings":...} / {"settings":...}); nil keeps the
	// current index's.
	Mappings, Settings []byte
	// From is "index" (default: copy the current index) or "source"
	// (SourceSQL, plus the current index's tombstones).
	From string
	// SourceSQL returns id, version, document and optionally a boolean
	// deleted column, like backfill.Options.SourceSQL.
	SourceSQL string
	// AcceptRejected swaps even when the new index refused documents.
	AcceptRejected bool
	// Keep is how long the old index is kept after the swap; a later
	// rebuild of the same name drops it once that has passed. 0 keeps it
	// until DropOld.
	Keep time.Duration
	// SwapDelta: catch-up rounds repeat until one copies at most this many
	// documents (default 1000), a round shrinks by less than a quarter (the
	// floor the write rate sets), or MaxRounds (default 20) have run. It
	// only bounds how much the final catch-up has to do.
	SwapDelta int
	MaxRounds int
	// Grace is how long the final catch-up waits after the swap for bulk
	// requests that resolved N-write before it moved; default 2s.
	Grace         time.Duration
	Batch         int           // documents per bulk request; default 1000
	Workers       int           // bulk requests at once; default 4
	SourceTimeout time.Duration // statement timeout of each cursor fetch; default 10m
	OutageTimeout time.Duration // how long Elasticsearch may be unreachable; default 5m
	Progress      *progress.Bar
	Logger        *slog.Logger // nil discards
}

// Report is what Run did.
type Report struct {
	Index      string          `json:"index"`
	Run        string          `json:"run"` // this run's id, stored as the row's run_id`
	OldIndex   string          `json:"old_index"`
	NewIndex   string          `json:"new_index"`
	Resumed    string          `json:"resumed_phase,omitempty"`
	Copied     int64           `json:"copied"`
	CaughtUp   int64           `json:"caught_up"`
	Rounds     int             `json:"catch_up_rounds"`
	Rejected   int64           `json:"rejected"`
	Samples    []source.Reject `json:"rejected_samples,omitempty"`
	Swapped    bool            `json:"swapped"`
	DroppedOld []string        `json:"dropped_old,omitempty"`
	Seconds    float64         `json:"seconds"`
}

// RejectedError is returned when the new index refused documents and
// AcceptRejected is false: nothing was swapped, and the rebuild can be
// continued with AcceptRejected or aborted.
type RejectedError struct {
	Index    string
	Rejected int64
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("indexer: rebuild %s: the new index refused %d documents; not swapped (fix the mapping and abort, or accept the rejected documents)", e.Index, e.Rejected)
}

// Run creates the next concrete index of o.Index with new mappings or
// settings, fills it while the relay keeps writing through N-write, and
// moves N, N-write and N-read to it in one atomic _aliases request.
//
// No write is lost, without dual writes: before the copy starts each
// shard's global checkpoint of the old index is recorded (every write up
// to it is visible after a refresh); after the copy, catch-up rounds copy the
// old index's documents with a higher _seq_no, shard by shard, and advance
// the checkpoints. Every copy is a versioned write (external_gte at the
// document's own version), so order does not matter: a copy older than
// what the new index holds loses. After the swap, writes still in flight
// to the old index are picked up by one final catch-up after Grace, and
// again by DropOld before the old index is deleted.
//
// The state is stored in <schema>.rebuilds; killed at any point, a rerun
// with the same options continues (an interrupted copy starts over into the
// same new index, an interrupted catch-up continues from its checkpoints)
// and N always points at a complete index.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	st, unlock, err := openStore(ctx, o.Pool, o.Schema, o.Index)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rep := &Report{Index: o.Index, Run: st.run}
	o.Logger = o.Logger.With("run", st.run)
	cur, err := st.load(ctx)
	if err != nil {
		return nil, err
	}
	behind, err := writeIndexOf(ctx, o.ES, o.Index)
	if err != nil {
		return nil, err
	}
	hash := o.hash()
	// otherOptions: the unfinished rebuild that is finished first was
	// started with other mappings, settings or source than these.
	otherOptions := false
	if cur != nil {
		switch cur.Phase {
		case PhaseCopying, PhaseCatchingUp:
			if behind == cur.New {
				// Swapped, but killed before the phase was stored.
				otherOptions = cur.Hash != hash
				cur.Phase = PhaseSwapped
				if err := st.setPhase(ctx, PhaseSwapped); err != nil {
					return nil, err
				}
			} else if behind != cur.Old {
				return nil, fmt.Errorf("indexer: rebuild %s: %s now points at %s, not at %s where the unfinished rebuild started; abort it", o.Index, indexer.WriteAlias(o.Index), behind, cur.Old)
			} else if cur.Hash != hash {
				return nil, fmt.Errorf("indexer: rebuild %s: an unfinished rebuild into %s has other mappings, settings or source; run it with the same options to continue, or abort it", o.Index, cur.New)
			}
			rep.Resumed = cur.Phase
		case PhaseSwapped:
			otherOptions = cur.Hash != hash
			rep.Resumed = cur.Phase
		default:
			dropped, err := dropKeptOld(ctx, o.ES, st, cur, false)
			if err != nil {
				return nil, err
			}
			rep.DroppedOld = dropped
			cur = nil
		}
	}
	if o.From == "index" && (cur == nil || cur.Phase == PhaseCopying) {
		from := behind
		if cur != nil {
			from = cur.Old
		}
		if err := checkSourceKept(ctx, o.ES, o.Index, from); err != nil {
			return nil, err
		}
	}
	r := &runner{o: o, st: st}
	if cur == nil {
		if cur, err = r.begin(ctx, behind, hash); err != nil {
			return nil, err
		}
	}
	r.cur = cur
	rep.OldIndex, rep.NewIndex = cur.Old, cur.New
	if rep.Resumed != "" {
		o.Logger.Info("rebuild resumed", "index", o.Index, "new_index", cur.New, "phase", rep.Resumed)
	}
	if cur.Phase == PhaseCopying {
		if err := r.copyAll(ctx, rep); err != nil {
			return rep, err
		}
	}
	if cur.Phase == PhaseCatchingUp {
		// Each round copies what was written during the previous one, so
		// rounds shrink until they reach what the write rate adds during a
		// round; more rounds after that gain nothing.
		prev := int64(-1)
		for rep.Rounds < o.MaxRounds {
			n, err := r.catchUp(ctx)
			rep.Rounds++
			rep.CaughtUp += n
			if err != nil {
				return rep, err
			}
			o.Logger.Info("rebuild caught up", "index", o.Index, "round", rep.Rounds, "documents", n)
			if n <= int64(o.SwapDelta) || (prev >= 0 && 4*n > 3*prev) {
				break
			}
			prev = n
		}
		rep.Rejected, rep.Samples = cur.Rejected, cur.Samples
		if cur.Rejected > 0 && !o.AcceptRejected {
			return rep, &RejectedError{Index: o.Index, Rejected: cur.Rejected}
		}
		if err := r.swap(ctx); err != nil {
			return rep, err
		}
		rep.Swapped = true
	}
	if cur.Phase == PhaseSwapped && !cur.Dropped {
		// Killed between deleting the old index and storing that.
		exists, err := indexExists(ctx, o.ES, cur.Old)
		if err != nil {
			return rep, err
		}
		cur.Dropped = !exists
	}
	if cur.Phase == PhaseSwapped && cur.Dropped {
		// The old index was dropped (after its last catch-up) before this
		// rebuild was finished: nothing is left to copy.
		if err := st.finish(ctx, 0); err != nil {
			return rep, err
		}
		rep.Swapped = true
	}
	if cur.Phase == PhaseSwapped && !cur.Dropped {
		select {
		case <-time.After(o.Grace):
		case <-ctx.Done():
			return rep, ctx.Err()
		}
		// Writes resolved to the old index before the swap may still be
		// applied to it after any wait; blocking its writes settles that:
		// the block waits for the writes in flight, later ones fail and
		// are retried by the relay through N-write (the new index), and
		// the catch-up after it copies everything the old index took.
		if err := r.blockWrites(ctx); err != nil {
			return rep, err
		}
		n, err := r.catchUp(ctx)
		rep.CaughtUp += n
		if err != nil {
			return rep, err
		}
		if err := st.finish(ctx, o.Keep); err != nil {
			return rep, err
		}
		rep.Swapped = true
	}
	rep.Rejected, rep.Samples = cur.Rejected, cur.Samples
	rep.Seconds = time.Since(start).Seconds()
	o.Logger.Info("rebuild finished", "index", o.Index, "old_index", cur.Old, "new_index", cur.New,
		"copied", rep.Copied, "caught_up", rep.CaughtUp, "rejected", rep.Rejected)
	if otherOptions {
		return rep, fmt.Errorf("indexer: rebuild %s: finished an interrupted earlier rebuild into %s, which was already swapped; it was started with other mappings, settings or source, so these were NOT applied: run the command again to rebuild with them (drop the old index %s first if it is kept)", o.Index, cur.New, cur.Old)
	}
	return rep, nil
}

func (o *Options) defaults() error {
	switch {
	case o.Pool == nil:
		return errors.New("indexer: rebuild: pool: no PostgreSQL pool")
	case o.ES == nil:
		return errors.New("indexer: rebuild: client: no Elasticsearch client")
	}
	if err := indexer.CheckName(o.Index); err != nil {
		return err
	}
	switch o.From {
	case "", "index":
		o.From = "index"
		if strings.TrimSpace(o.SourceSQL) != "" {
			return errors.New("indexer: rebuild: source_sql: only used with from=source")
		}
	case "source":
		if strings.TrimSpace(o.SourceSQL) == "" {
			return errors.New("indexer: rebuild: source_sql: required with from=source")
		}
	default:
		return fmt.Errorf("indexer: rebuild: from: must be \"index\" or \"source\", got %q", o.From)
	}
	if o.Keep < 0 {
		return fmt.Errorf("indexer: rebuild: keep: must not be negative, got %s", o.Keep)
	}
	if o.SwapDelta == 0 {
		o.SwapDelta = 1000
	}
	if o.MaxRounds <= 0 {
		o.MaxRounds = 20
	}
	if o.Grace <= 0 {
		o.Grace = 2 * time.Second
	}
	if o.Batch <= 0 {
		o.Batch = 1000
	}
	if o.Workers <= 0 {
		o.Workers = 4
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

// hash identifies what the new index is built from, so a rerun with other
// options does not continue a rebuild it did not start.
func (o *Options) hash() string {
	h := sha256.New()
	for _, b := range [][]byte{o.Mappings, o.Settings, []byte(o.From), []byte(o.SourceSQL)} {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

type runner struct {
	o   Options
	st  *store
	cur *record
}

// begin records the checkpoints of old and creates the next index.
func (r *runner) begin(ctx context.Context, old, hash string) (*record, error) {
	next, err := nextIndex(r.o.Index, old)
	if err != nil {
		return nil, err
	}
	exists, err := indexExists(ctx, r.o.ES, next)
	if err != nil {
		return nil, err
	}
	if exists {
		return nil, fmt.Errorf("indexer: rebuild %s: %s already exists and no rebuild of this name is building it; delete it or rename it first", r.o.Index, next)
	}
	cps, err := shardCheckpoints(ctx, r.o.ES, old)
	if err != nil {
		return nil, err
	}
	row := &record{Old: old, New: next, Phase: PhaseCopying, Hash: hash, Checkpoints: cps}
	if err := r.st.begin(ctx, row); err != nil {
		return nil, err
	}
	return row, nil
}

// createIndex creates the new index, with the current index's mappings
// and settings where none were given. Already existing (a killed run made
// it) is fine: the row says it is ours.
func (r *runner) createIndex(ctx context.Context) error {
	if err := r.st.check(ctx); err != nil {
		return err
	}
	body, err := newIndexBody(ctx, r.o.ES, r.cur.Old, r.o.Mappings, r.o.Settings)
	if err != nil {
		return err
	}
	_, err = indexer.Perform(ctx, r.o.ES, "create index "+r.cur.New, esapi.IndicesCreateRequest{Index: r.cur.New, Body: bytes.NewReader(body)})
	var re *indexer.ResponseError
	if errors.As(err, &re) && re.Type == "resource_already_exists_exception" {
		return nil
	}
	if errors.As(err, &re) && re.Status == 400 {
		return fmt.Errorf("indexer: rebuild %s: Elasticsearch refused the new mappings or settings: %w", r.o.Index, err)
	}
	return err
}

// copyAll fills the new index from the old one or from the source, then
// moves to catching_up. An interrupted copy starts over: the PIT it read
// is gone, and copying a document twice is harmless.
func (r *runner) copyAll(ctx context.Context, rep *Report) error {
	if err := r.createIndex(ctx); err != nil {
		return err
	}
	if err := r.st.resetCopy(ctx); err != nil {
		return err
	}
	// The copy starts over, so checkpoints read now are as good as the
	// first ones and leave less to catch up.
	cps, err := shardCheckpoints(ctx, r.o.ES, r.cur.Old)
	if err != nil {
		return err
	}
	if err := r.st.setCheckpoints(ctx, cps); err != nil {
		return err
	}
	r.cur.Checkpoints = cps
	r.cur.Rejected, r.cur.Samples = 0, nil
	old := []string{r.cur.Old}
	total, err := scan.Count(ctx, r.o.ES, old)
	if err != nil {
		return err
	}
	tombstones := json.RawMessage(`{"term":{"outboxd_deleted":true}}`)
	w := r.newWriter(ctx, true)
	if r.o.From == "source" {
		if total, err = scanCountQuery(ctx, r.o.ES, r.cur.Old, tombstones); err != nil {
			return err
		}
		// Opened after the checkpoints: anything the snapshot misses was
		// written to the old index after them and is caught up.
		rows, err := r.copySource(ctx, w, total)
		if err != nil {
			return w.abandon(err)
		}
		total += rows
	} else {
		r.o.Progress.SetTotal(total)
		_ = r.st.setTotal(ctx, total)
	}
	opts := scan.Options{Indices: old, PageSize: r.o.Batch, Refresh: true}
	if r.o.From == "source" {
		opts.Query = tombstones
	}
	err = scan.Each(ctx, r.o.ES, opts, func(h scan.Hit) error {
		return w.add(indexer.CopyItem{ID: h.ID, Version: h.Version, Source: bytes.Clone(h.Source)})
	})
	if err != nil {
		return w.abandon(err)
	}
	n, err := w.close()
	rep.Copied += n
	if err != nil {
		return err
	}
	_ = r.st.setTotal(ctx, max(total, n))
	r.cur.Phase = PhaseCatchingUp
	return r.st.setPhase(ctx, PhaseCatchingUp)
}

// copySource streams the rows of SourceSQL, in a read-only snapshot, to
// the writer and returns how many there were.
func (r *runner) copySource(ctx context.Context, w *copyWriter, tombstones int64) (int64, error) {
	bo := source.Query{Index: r.o.Index, SourceSQL: r.o.SourceSQL, Batch: r.o.Batch, SourceTimeout: r.o.SourceTimeout}
	conn, err := r.o.Pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("indexer: rebuild: %w", err)
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, fmt.Errorf("indexer: rebuild: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := source.Declare(ctx, tx, bo, ""); err != nil {
		return 0, err
	}
	total := source.Estimate(ctx, tx, r.o.SourceSQL) + tombstones
	r.o.Progress.SetTotal(total)
	_ = r.st.setTotal(ctx, total)
	deletedAt := time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
	var rows int64
	for {
		events, err := source.Fetch(ctx, tx, bo)
		if err != nil || len(events) == 0 {
			return rows, err
		}
		rows += int64(len(events))
		for _, e := range events {
			d, reason := indexer.CopyItemOf(e, deletedAt)
			if reason != "" {
				w.reject(e.SourceID, reason)
				continue
			}
			if err := w.add(d); err != nil {
				return rows, err
			}
		}
	}
}

// catchUp copies the old index's documents above each shard's checkpoint
// and advances the checkpoints to those read before the refresh: every
// write up to them is then visible and copied.
func (r *runner) catchUp(ctx context.Context) (int64, error) {
	if err := r.st.check(ctx); err != nil {
		return 0, err
	}
	next, err := shardCheckpoints(ctx, r.o.ES, r.cur.Old)
	if err != nil {
		return 0, err
	}
	if _, err := indexer.Perform(ctx, r.o.ES, "refresh "+r.cur.Old, esapi.IndicesRefreshRequest{Index: []string{r.cur.Old}}); err != nil {
		return 0, err
	}
	w := r.newWriter(ctx, false)
	for shard, cp := range r.cur.Checkpoints {
		if err := r.scanShard(ctx, shard, cp, next[shard], w); err != nil {
			return 0, w.abandon(err)
		}
	}
	n, err := w.close()
	if err != nil {
		return n, err
	}
	r.cur.Checkpoints = next
	return n, r.st.setCheckpoints(ctx, next)
}

// scanShard copies one shard's documents with _seq_no in (from, to]. A
// shard numbers its operations densely, so a window of Batch numbers holds
// at most Batch live documents and one request per window reads them all:
// unlike paging through "everything above from" sorted by _seq_no, each
// request costs its window, not the whole rest of the shard. No point in
// time: a document changed meanwhile moves to a higher _seq_no, which a
// later window or the next round sees.
func (r *runner) scanShard(ctx context.Context, shard string, from, to int64, w *copyWriter) error {
	op := "catch up " + r.cur.Old + " shard " + shard
	for lo := from; lo < to; lo += int64(r.o.Batch) {
		body, _ := json.Marshal(map[string]any{
			"size":             r.o.Batch,
			"query":            map[string]any{"range": map[string]any{"_seq_no": map[string]int64{"gt": lo, "lte": min(lo+int64(r.o.Batch), to)}}},
			"version":          true,
			"track_total_hits": false,
		})
		var page struct {
			Hits struct {
				Hits []scan.Hit `json:"hits"`
			} `json:"hits"`
		}
		if err := scan.Do(ctx, r.o.ES, op, esapi.SearchRequest{Index: []string{r.cur.Old}, Preference: "_shards:" + shard, Body: bytes.NewReader(body)}, &page); err != nil {
			return err
		}
		for _, h := range page.Hits.Hits {
			if err := w.add(indexer.CopyItem{ID: h.ID, Version: h.Version, Source: h.Source}); err != nil {
				return err
			}
		}
	}
	return nil
}

// swap moves the three names in one atomic request. The remove of N-write
// must find it on the old index, so a layout changed by someone else fails
// the whole request instead of being overwritten.
func (r *runner) swap(ctx context.Context) error {
	if _, err := indexer.Perform(ctx, r.o.ES, "refresh "+r.cur.New, esapi.IndicesRefreshRequest{Index: []string{r.cur.New}}); err != nil {
		return err
	}
	oldJ, _ := json.Marshal(r.cur.Old)
	newJ, _ := json.Marshal(r.cur.New)
	name := r.o.Index
	var actions []string
	for _, a := range []string{indexer.WriteAlias(name), name, indexer.ReadAlias(name)} {
		aj, _ := json.Marshal(a)
		must := a == indexer.WriteAlias(name)
		actions = append(actions, fmt.Sprintf(`{"remove":{"index":%s,"alias":%s,"must_exist":%t}}`, oldJ, aj, must))
	}
	for _, a := range [][2]string{{indexer.WriteAlias(name), `"is_write_index":true`}, {name, `"filter":` + indexer.ReadFilter}, {indexer.ReadAlias(name), `"filter":` + indexer.ReadFilter}} {
		aj, _ := json.Marshal(a[0])
		actions = append(actions, `{"add":{"index":`+string(newJ)+`,"alias":`+string(aj)+`,`+a[1]+`}}`)
	}
	body := `{"actions":[` + strings.Join(actions, ",") + `]}`
	if err := r.st.check(ctx); err != nil {
		return err
	}
	if _, err := indexer.Perform(ctx, r.o.ES, "swap aliases of "+name, esapi.IndicesUpdateAliasesRequest{Body: strings.NewReader(body)}); err != nil {
		return err
	}
	r.cur.Phase = PhaseSwapped
	if err := r.st.setPhase(ctx, PhaseSwapped); err != nil {
		return err
	}
	r.o.Logger.Info("rebuild swapped", "index", name, "old_index", r.cur.Old, "new_index", r.cur.New)
	return nil
}

// blockWrites makes the old index read-only for writes (index.blocks.write)
// once the names have left it.
func (r *runner) blockWrites(ctx context.Context) error {
	if err := r.st.check(ctx); err != nil {
		return err
	}
	if _, err := indexer.Perform(ctx, r.o.ES, "block writes to "+r.cur.Old, esapi.IndicesAddBlockRequest{Index: []string{r.cur.Old}, Block: "write"}); err != nil {
		return fmt.Errorf("indexer: rebuild %s: block writes to the old index %s after the swap: %w", r.o.Index, r.cur.Old, err)
	}
	return nil
}

// Abort deletes the half-built index of an unfinished rebuild of
// name and returns its name. A swapped rebuild cannot be aborted: N
// already reads the new index.
func Abort(ctx context.Context, pool *pgxpool.Pool, schemaName string, es *elasticsearch.Client, name string) (string, error) {
	if err := indexer.CheckName(name); err != nil {
		return "", err
	}
	st, unlock, err := openStore(ctx, pool, schemaName, name)
	if err != nil {
		return "", err
	}
	defer unlock()
	cur, err := st.load(ctx)
	if err != nil {
		return "", err
	}
	if cur == nil || (cur.Phase != PhaseCopying && cur.Phase != PhaseCatchingUp) {
		if cur != nil && cur.Phase == PhaseSwapped {
			return "", fmt.Errorf("indexer: rebuild %s: nothing to abort: %s already reads %s; run the rebuild again (or --drop-old) to finish it", name, name, cur.New)
		}
		return "", fmt.Errorf("indexer: rebuild %s: nothing to abort (no unfinished rebuild)", name)
	}
	if behind, err := writeIndexOf(ctx, es, name); err != nil {
		return "", err
	} else if behind == cur.New {
		_ = st.setPhase(ctx, PhaseSwapped)
		return "", fmt.Errorf("indexer: rebuild %s: already swapped to %s; run the rebuild again to finish it", name, cur.New)
	}
	if err := st.check(ctx); err != nil {
		return "", err
	}
	if err := deleteUnaliased(ctx, es, name, cur.New); err != nil {
		return "", err
	}
	return cur.New, st.setPhase(ctx, PhaseAborted)
}

// DropOld deletes the index a finished rebuild of name swapped away
// from, after one more catch-up of anything written to it late, and
// returns its name.
func DropOld(ctx context.Context, pool *pgxpool.Pool, schemaName string, es *elasticsearch.Client, name string) ([]string, error) {
	if err := indexer.CheckName(name); err != nil {
		return nil, err
	}
	st, unlock, err := openStore(ctx, pool, schemaName, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	cur, err := st.load(ctx)
	if err != nil {
		return nil, err
	}
	if cur == nil || (cur.Phase != PhaseSwapped && cur.Phase != PhaseDone) {
		return nil, fmt.Errorf("indexer: rebuild %s: no finished rebuild whose old index could be dropped", name)
	}
	return dropKeptOld(ctx, es, st, cur, true)
}

// dropKeptOld deletes cur's old index when force is set or its keep time
// has passed. A later rebuild refuses to start while it is kept: the
// rebuilds table remembers one old index per name.
func dropKeptOld(ctx context.Context, es *elasticsearch.Client, st *store, cur *record, force bool) ([]string, error) {
	if cur.Phase == PhaseAborted || cur.Dropped {
		if force {
			return nil, fmt.Errorf("indexer: rebuild %s: the old index %s was already dropped", st.index, cur.Old)
		}
		return nil, nil
	}
	exists, err := indexExists(ctx, es, cur.Old)
	if err != nil || !exists {
		return nil, err
	}
	if alias, err := aliasOn(ctx, es, st.index, cur.Old); err != nil {
		return nil, err
	} else if alias != "" {
		// The names were moved back to the old index (an undo of the
		// rebuild): it is the live index now, never dropped.
		if force {
			return nil, fmt.Errorf("indexer: rebuild %s: %s points at %s again (the aliases were moved back to it); outboxd never deletes an index %s, %s or %s points at; nothing dropped",
				st.index, alias, cur.Old, st.index, indexer.WriteAlias(st.index), indexer.ReadAlias(st.index))
		}
		return nil, nil
	}
	if !force && (cur.KeepUntil == nil || time.Now().Before(*cur.KeepUntil)) {
		until := "until outboxd rebuild --drop-old"
		if cur.KeepUntil != nil {
			until = "until " + cur.KeepUntil.UTC().Format(time.RFC3339)
		}
		return nil, fmt.Errorf("indexer: rebuild %s: the previous rebuild's old index %s is kept %s; drop it first (--drop-old)", st.index, cur.Old, until)
	}
	// Late writes to the old index (bulk requests that resolved N-write
	// before the swap) are copied before it goes.
	r := &runner{o: Options{ES: es, Batch: 1000, Workers: 2, OutageTimeout: time.Minute, Logger: slog.New(slog.DiscardHandler)}, st: st, cur: cur}
	if _, err := r.catchUp(ctx); err != nil {
		return nil, err
	}
	if err := st.check(ctx); err != nil {
		return nil, err
	}
	if err := deleteUnaliased(ctx, es, st.index, cur.Old); err != nil {
		return nil, err
	}
	if err := st.dropped(ctx); err != nil {
		return nil, err
	}
	if cur.Phase == PhaseSwapped {
		// A rebuild killed after its swap: the catch-up above was its
		// final one, so dropping the old index finishes it.
		if err := st.finish(ctx, 0); err != nil {
			return nil, err
		}
	}
	return []string{cur.Old}, nil
}

// checkSourceKept refuses a copy from index when its _source does not
// hold every field: the copy would silently lose what it leaves out.
func checkSourceKept(ctx context.Context, es *elasticsearch.Client, name, index string) error {
	var got map[string]struct {
		Mappings struct {
			Source struct {
				Enabled  *bool    `json:"enabled"`
				Includes []string `json:"includes"`
				Excludes []string `json:"excludes"`
			} `json:"_source"`
		} `json:"mappings"`
	}
	if err := scan.Do(ctx, es, "get mapping of "+index, esapi.IndicesGetMappingRequest{Index: []string{index}}, &got); err != nil {
		return err
	}
	src := got[index].Mappings.Source
	why := ""
	switch {
	case src.Enabled != nil && !*src.Enabled:
		why = "_source is disabled"
	case len(src.Excludes) > 0:
		why = "_source.excludes leaves out " + strings.Join(src.Excludes, ", ")
	case len(src.Includes) > 0:
		why = "_source.includes keeps only " + strings.Join(src.Includes, ", ")
	}
	if why != "" {
		return fmt.Errorf("indexer: rebuild %s: from: %s cannot be copied from the index: %s, so those fields would be lost; rebuild from the source table instead (--from source --source-sql ...)", name, index, why)
	}
	return nil
}

// deleteUnaliased deletes index unless one of name's aliases (N, N-write,
// N-read) points at it, checked right before the delete: every delete of
// an outboxd tool goes through here, so none removes live data.
func deleteUnaliased(ctx context.Context, es *elasticsearch.Client, name, index string) error {
	alias, err := aliasOn(ctx, es, name, index)
	if err != nil {
		return err
	}
	if alias != "" {
		return fmt.Errorf("indexer: rebuild %s: refusing to delete %s: %s points at it (outboxd never deletes an index %s, %s or %s points at)",
			name, index, alias, name, indexer.WriteAlias(name), indexer.ReadAlias(name))
	}
	if _, err := indexer.Perform(ctx, es, "delete index "+index, esapi.IndicesDeleteRequest{Index: []string{index}}); err != nil && !scan.IsStatus(err, 404) {
		return err
	}
	return nil
}

// aliasOn returns the first of name's aliases that points at index, or "".
func aliasOn(ctx context.Context, es *elasticsearch.Client, name, index string) (string, error) {
	r, err := resolveNames(ctx, es, name, indexer.WriteAlias(name), indexer.ReadAlias(name))
	if err != nil {
		return "", err
	}
	for _, a := range r.Aliases {
		for _, t := range a.Indices {
			if t == index {
				return a.Name, nil
			}
		}
	}
	return "", nil
}

// writeIndexOf returns the concrete index behind name's write alias.
func writeIndexOf(ctx context.Context, es *elasticsearch.Client, name string) (string, error) {
	write := indexer.WriteAlias(name)
	r, err := resolveNames(ctx, es, write)
	if err != nil {
		return "", err
	}
	var t []string
	for _, a := range r.Aliases {
		if a.Name == write {
			t = a.Indices
		}
	}
	if len(t) != 1 {
		return "", fmt.Errorf("indexer: rebuild %s: %s must point at exactly one index (it points at %d); run outboxd migrate-index --index %s first", name, write, len(t), name)
	}
	return t[0], nil
}

// resolved is the answer of _resolve/index.
type resolved struct {
	Indices []struct {
		Name string `json:"name"`
	} `json:"indices"`
	Aliases []struct {
		Name    string   `json:"name"`
		Indices []string `json:"indices"`
	} `json:"aliases"`
}

func resolveNames(ctx context.Context, es *elasticsearch.Client, names ...string) (*resolved, error) {
	raw, err := indexer.Perform(ctx, es, "resolve index", esapi.IndicesResolveIndexRequest{Name: names, ExpandWildcards: "all", IgnoreUnavailable: &ptrTrue})
	if err != nil {
		return nil, err
	}
	var r resolved
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("indexer: resolve index: %w", err)
	}
	return &r, nil
}

// nextIndex names the index after old: N-000002 after N-000001.
func nextIndex(name, old string) (string, error) {
	n := 1
	if suffix, ok := strings.CutPrefix(old, name+"-"); ok && len(suffix) == 6 {
		v, err := strconv.Atoi(suffix)
		if err != nil {
			return "", fmt.Errorf("indexer: rebuild %s: cannot number the index after %s", name, old)
		}
		n = v
	}
	if n >= 999999 {
		return "", fmt.Errorf("indexer: rebuild %s: no index number left after %s", name, old)
	}
	return fmt.Sprintf("%s-%06d", name, n+1), nil
}

func indexExists(ctx context.Context, es *elasticsearch.Client, index string) (bool, error) {
	r, err := resolveNames(ctx, es, index)
	if err != nil {
		return false, err
	}
	for _, i := range r.Indices {
		if i.Name == index {
			return true, nil
		}
	}
	return false, nil
}

// shardCheckpoints returns each shard's global checkpoint: every
// operation up to it has been processed on every in-sync copy, so after a
// later refresh a search sees it whichever copy answers.
func shardCheckpoints(ctx context.Context, es *elasticsearch.Client, index string) (map[string]int64, error) {
	var out struct {
		Indices map[string]struct {
			Shards map[string][]struct {
				Routing struct {
					Primary bool `json:"primary"`
				} `json:"routing"`
				SeqNo struct {
					GlobalCheckpoint int64 `json:"global_checkpoint"`
				} `json:"seq_no"`
			} `json:"shards"`
		} `json:"indices"`
	}
	if err := scan.Do(ctx, es, "shard stats of "+index, esapi.IndicesStatsRequest{Index: []string{index}, Metric: []string{"docs"}, Level: "shards"}, &out); err != nil {
		return nil, err
	}
	cps := map[string]int64{}
	for shard, copies := range out.Indices[index].Shards {
		for _, c := range copies {
			if c.Routing.Primary {
				cps[shard] = c.SeqNo.GlobalCheckpoint
			}
		}
	}
	if len(cps) == 0 {
		return nil, fmt.Errorf("indexer: shard stats of %s: no primary shard reported (is the index red?)", index)
	}
	return cps, nil
}

func scanCountQuery(ctx context.Context, es *elasticsearch.Client, index string, query json.RawMessage) (int64, error) {
	var out struct {
		Count int64 `json:"count"`
	}
	body := `{"query":` + string(query) + `}`
	if err := scan.Do(ctx, es, "count "+index, esapi.CountRequest{Index: []string{index}, Body: strings.NewReader(body)}, &out); err != nil {
		return 0, err
	}
	return out.Count, nil
}

// newIndexBody is the create body of the new index: the given mappings
// and settings, or the old index's, with the outboxd fields merged in.
func newIndexBody(ctx context.Context, es *elasticsearch.Client, old string, mappings, settings []byte) ([]byte, error) {
	m, err := unwrapSpec("mappings", mappings)
	if err != nil {
		return nil, err
	}
	s, err := unwrapSpec("settings", settings)
	if err != nil {
		return nil, err
	}
	if m == nil {
		var got map[string]struct {
			Mappings json.RawMessage `json:"mappings"`
		}
		if err := scan.Do(ctx, es, "get mapping of "+old, esapi.IndicesGetMappingRequest{Index: []string{old}}, &got); err != nil {
			return nil, err
		}
		m = got[old].Mappings
	}
	// Settings not given are the current index's: the shard count,
	// replicas, analysis and gc_deletes stay unless they are overridden.
	if s, err = mergedSettings(ctx, es, old, s); err != nil {
		return nil, err
	}
	spec, _ := json.Marshal(map[string]json.RawMessage{"mappings": m, "settings": s})
	return indexer.IndexBody(spec)
}

// unwrapSpec accepts the object itself or {"<key>": object}.
func unwrapSpec(key string, b []byte) (json.RawMessage, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("indexer: rebuild: %s: must be a JSON object: %w", key, err)
	}
	if inner, ok := obj[key]; ok && len(obj) == 1 {
		return inner, nil
	}
	return b, nil
}

// mergedSettings are the old index's settings, without those
// Elasticsearch sets itself and refuses at creation, with given laid over
// them key by key (a null in given removes the key: its default applies).
func mergedSettings(ctx context.Context, es *elasticsearch.Client, old string, given json.RawMessage) (json.RawMessage, error) {
	var got map[string]struct {
		Settings map[string]any `json:"settings"`
	}
	if err := scan.Do(ctx, es, "get settings of "+old, esapi.IndicesGetSettingsRequest{Index: []string{old}, FlatSettings: &ptrTrue}, &got); err != nil {
		return nil, err
	}
	flat := got[old].Settings
	for k := range flat {
		if !copyableSetting(k) {
			delete(flat, k)
		}
	}
	if len(given) > 0 {
		var user map[string]any
		if err := json.Unmarshal(given, &user); err != nil || user == nil {
			return nil, fmt.Errorf("indexer: rebuild: settings: must be a JSON object")
		}
		flattenSettings("", user, flat)
	}
	return json.Marshal(flat)
}

// copyableSetting says whether an old index's (flat) setting can be given
// when creating an index.
func copyableSetting(key string) bool {
	for _, k := range []string{"uuid", "version", "creation_date", "provided_name", "history_uuid", "resize", "routing", "blocks", "verified_before_close", "shrink"} {
		if key == "index."+k || strings.HasPrefix(key, "index."+k+".") {
			return false
		}
	}
	return true
}

// flattenSettings writes settings, nested or dotted, as flat keys under
// "index." into out; null removes a key and everything below it.
func flattenSettings(prefix string, settings map[string]any, out map[string]any) {
	for k, v := range settings {
		key := prefix + k
		if prefix == "" && key != "index" && !strings.HasPrefix(key, "index.") {
			key = "index." + key
		}
		switch v := v.(type) {
		case map[string]any:
			flattenSettings(key+".", v, out)
		case nil:
			for have := range out {
				if have == key || strings.HasPrefix(have, key+".") {
					delete(out, have)
				}
			}
		default:
			out[key] = v
		}
	}
}

var ptrTrue = true
