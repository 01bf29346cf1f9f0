package rebuild

import (
	"context"
	"errors"
	"fmt"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema"
)

// Home returns, for indexer.Options.Rebuilt, the concrete index
// the rebuilds table says name's documents live in: the new index of a
// swapped or finished rebuild, else the old one. "" when no rebuild of
// name is recorded (or the schema has no rebuilds table yet).
func Home(db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schemaName string) func(ctx context.Context, name string) (string, error) {
	return func(ctx context.Context, name string) (string, error) {
		id, err := schema.Ident(schemaName)
		if err != nil {
			return "", err
		}
		var home string
		err = db.QueryRow(ctx, `SELECT CASE WHEN phase IN ('swapped', 'done') THEN new_index ELSE old_index END
FROM `+id+`.rebuilds WHERE index_name = $1`, name).Scan(&home)
		var pe *pgconn.PgError
		switch {
		case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pe) && pe.Code == "42P01":
			return "", nil
		case err != nil:
			return "", err
		}
		return home, nil
	}
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
