package documents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// ErrNoIDs is wrapped when a definition has no ids query, so the tools
// that read a whole index cannot list its ids.
var ErrNoIDs = errors.New("the definition has no ids query")

// Lookup returns index's definition as the tools that read a whole index
// need it (without its watches), or nil when the index has none, also in
// an outbox schema migrated before definitions existed.
func Lookup(ctx context.Context, db Querier, schemaName, index string) (*Definition, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	d := &Definition{Index: index}
	err = db.QueryRow(ctx, `SELECT sql, revision, coalesce(ids_sql, '') FROM `+id+`.documents WHERE index_name = $1`, index).
		Scan(&d.SQL, &d.Revision, &d.IDsSQL)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703"):
		// No documents table, or no ids_sql column: a schema whose
		// migrations predate them defines no index (the relay refuses
		// to start on it anyway).
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("documents: reading the definition of %s: %w", index, err)
	}
	return d, nil
}

// NeedIDs says why d cannot be read whole, or nil: it needs an ids query.
func (d *Definition) NeedIDs() error {
	if strings.TrimSpace(d.IDsSQL) != "" {
		return nil
	}
	return fmt.Errorf("documents: index %s: ids_sql: its definition has no ids query, so the ids of all its documents cannot be listed; declare one: outboxd documents define --index %s --sql-file F --ids-sql 'SELECT id FROM ...' (%w)",
		d.Index, d.Index, ErrNoIDs)
}

// checkIDsSQL says why sql cannot be a definition's ids query, or nil: it
// must prepare without parameters, return exactly one column, and run in a
// READ ONLY transaction within timeout (for its first row).
func checkIDsSQL(ctx context.Context, pool *pgxpool.Pool, sql string, timeout time.Duration) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("cannot reach PostgreSQL to check the ids SQL: %w", err)
	}
	defer conn.Release()
	sd, err := conn.Conn().PgConn().Prepare(ctx, "", sql, nil)
	if err != nil {
		return idsError("PostgreSQL cannot prepare it", err)
	}
	if len(sd.ParamOIDs) > 0 {
		return fmt.Errorf("ids_sql: uses %d parameters; it takes none (it lists every source_id of the index)", len(sd.ParamOIDs))
	}
	if len(sd.Fields) != 1 {
		return fmt.Errorf("ids_sql: returns %d columns; it must return one, the source_id (as the table's key, e.g. SELECT id FROM tutorials)", len(sd.Fields))
	}
	// Wrapped as the tools wrap it (a cursor over a subquery), so a
	// statement that cannot be a subquery fails here.
	_, err = trialRun(ctx, conn, timeout, `SELECT q.id::text FROM (`+sql+`) AS q(id) LIMIT 1`)
	var setup *trialSetupError
	switch {
	case errors.As(err, &setup):
		return fmt.Errorf("cannot run the ids SQL: %w", setup.err)
	case sqlState(err) == "25006":
		return idsError("it is not read-only", err)
	case sqlState(err) == "57014":
		return idsError(fmt.Sprintf("its first row did not come within %v", timeout), err)
	case err != nil:
		return idsError("it fails", err)
	}
	return nil
}

func idsError(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("ids_sql: %s: %s (SQLSTATE %s)", what, pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("ids_sql: %s: %w", what, err)
}
