package rebuild

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
)

// finish ends a swapped rebuild. Writes resolved to the old index before
// the swap may still reach it: after Grace its writes are blocked and one
// last catch-up copies what it took; the row is then done, the old index
// kept for Keep. A rebuild whose old index was already dropped (by
// DropOld, after its own catch-up) has nothing left to copy.
func (r *runner) finish(ctx context.Context, rep *Report) error {
	cur := r.cur
	if !cur.Dropped {
		// Killed between deleting the old index and storing that.
		exists, err := indexExists(ctx, r.o.ES, cur.Old)
		if err != nil {
			return err
		}
		cur.Dropped = !exists
	}
	if cur.Dropped {
		// The old index was dropped (after its last catch-up) before this
		// rebuild was finished: nothing is left to copy.
		if err := r.st.finish(ctx, 0); err != nil {
			return err
		}
		rep.Swapped = true
		return nil
	}
	select {
	case <-time.After(r.o.Grace):
	case <-ctx.Done():
		return ctx.Err()
	}
	// Writes resolved to the old index before the swap may still be
	// applied to it after any wait; blocking its writes settles that:
	// the block waits for the writes in flight, later ones fail and
	// are retried by the relay through N-write (the new index), and
	// the catch-up after it copies everything the old index took.
	if err := r.blockWrites(ctx); err != nil {
		return err
	}
	n, err := r.catchUp(ctx)
	rep.CaughtUp += n
	if err != nil {
		return err
	}
	if err := r.st.finish(ctx, r.o.Keep); err != nil {
		return err
	}
	rep.Swapped = true
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
