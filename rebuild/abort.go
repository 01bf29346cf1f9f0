package rebuild

import (
	"context"
	"fmt"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
)

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

// Forget deletes the rebuilds table's record of name, so that the
// next bootstrap may start the index over, empty. It forgets a lost
// layout, never a live one: it refuses while an index the record names
// still exists or one of name's aliases points at an index.
func Forget(ctx context.Context, pool *pgxpool.Pool, schemaName string, es *elasticsearch.Client, name string) error {
	if err := indexer.CheckName(name); err != nil {
		return err
	}
	st, unlock, err := openStore(ctx, pool, schemaName, name)
	if err != nil {
		return err
	}
	defer unlock()
	cur, err := st.load(ctx)
	if err != nil {
		return err
	}
	if cur == nil {
		return fmt.Errorf("indexer: rebuild %s: no rebuild is recorded; nothing to forget", name)
	}
	for _, idx := range []string{cur.Old, cur.New} {
		exists, err := indexExists(ctx, es, idx)
		if err != nil {
			return err
		}
		if exists {
			return fmt.Errorf("indexer: rebuild %s: %s still exists; point the aliases at the index that holds the documents (outboxd migrate-index --index %s) instead; nothing forgotten", name, idx, name)
		}
	}
	r, err := resolveNames(ctx, es, name, indexer.WriteAlias(name), indexer.ReadAlias(name))
	if err != nil {
		return err
	}
	for _, a := range r.Aliases {
		if len(a.Indices) > 0 {
			return fmt.Errorf("indexer: rebuild %s: %s points at %v; the layout is not lost; nothing forgotten", name, a.Name, a.Indices)
		}
	}
	return st.onLock(ctx, func(ctx context.Context, conn *pgxpool.Conn) error {
		_, err := conn.Exec(ctx, `DELETE FROM `+st.table+` WHERE index_name = $1`, name)
		return st.wrap(err)
	})
}
