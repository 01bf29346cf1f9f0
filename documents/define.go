package documents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// DefaultCheckTimeout is the statement timeout of the trial run of a
// definition when it is declared.
const DefaultCheckTimeout = 5 * time.Second

// Definition is one index's document definition as stored.
type Definition struct {
	Index       string     `json:"index"`
	SQL         string     `json:"sql"`
	Revision    int        `json:"revision"`
	DefinedBy   string     `json:"defined_by"`
	DefinedAt   time.Time  `json:"defined_at"`
	PreviousSQL string     `json:"previous_sql,omitempty"`
	PreviousBy  string     `json:"previous_by,omitempty"`
	PreviousAt  *time.Time `json:"previous_at,omitempty"`
	// IDsSQL returns every source_id of the index (one column): what
	// backfill, reconcile and rebuild --from source ask SQL for. Empty
	// when none was declared.
	IDsSQL         string  `json:"ids_sql,omitempty"`
	PreviousIDsSQL string  `json:"previous_ids_sql,omitempty"`
	Watches        []Watch `json:"watches"`
}

// DefineOptions declare an index's definition.
type DefineOptions struct {
	Index string
	// SQL returns (source_id text, document jsonb) for the ids in $1
	// (text[]), and nothing else.
	SQL string
	// IDsSQL, optional, returns every source_id of the index as one column
	// (SELECT id FROM tutorials), in the form the definition returns them
	// as text: the tools that load or check a whole index (backfill,
	// reconcile, rebuild --from source) read the definition for its ids.
	// Empty keeps the one already declared, if any.
	IDsSQL       string
	Operator     string        // who declares it, for the audit log
	CheckTimeout time.Duration // of the trial run; default DefaultCheckTimeout
}

// Define checks opts.SQL and stores it as the index's definition,
// replacing an earlier one (kept as previous_sql) and writing an audit_log
// row. The checks (see checkSQL) run before anything is written; a failed
// one is a *DefinitionError naming the reason. An index that has upsert
// or delete events in the outbox is event-fed and is refused
// (ErrEventFed). Redefining an index does not read its documents again:
// run `outboxd backfill --index N` for that.
func Define(ctx context.Context, pool *pgxpool.Pool, schemaName string, opts DefineOptions) (*Definition, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	fail := func(reason string, err error) error {
		return &DefinitionError{Index: opts.Index, Reason: reason, Err: err}
	}
	if err := outbox.ValidateIndexName(opts.Index); err != nil {
		return nil, fail("index: "+err.Error(), nil)
	}
	if strings.TrimSpace(opts.Operator) == "" {
		return nil, fail("operator: must name who acts (it goes to audit_log)", nil)
	}
	if opts.CheckTimeout <= 0 {
		opts.CheckTimeout = DefaultCheckTimeout
	}
	if err := checkSQL(ctx, pool, opts.SQL, opts.CheckTimeout); err != nil {
		return nil, &DefinitionError{Index: opts.Index, Reason: err.Error(), Err: errors.Unwrap(err)}
	}
	if strings.TrimSpace(opts.IDsSQL) != "" {
		if err := checkIDsSQL(ctx, pool, opts.IDsSQL, opts.CheckTimeout); err != nil {
			return nil, &DefinitionError{Index: opts.Index, Reason: err.Error(), Err: errors.Unwrap(err)}
		}
	}
	var d *Definition
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Holds appends back until this commits, and waits for those in
		// progress: no upsert can slip in between the check below and
		// the guard trigger.
		if _, err := tx.Exec(ctx, `LOCK TABLE `+id+`.events IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return err
		}
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+id+`.events WHERE index_name = $1 AND op <> 'refresh'`, opts.Index).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fail(fmt.Sprintf("the outbox holds %d upsert/delete events for it: it is event-fed; define the documents under a new index name (or once retention has deleted them)", n), ErrEventFed)
		}
		d = &Definition{Index: opts.Index, SQL: opts.SQL, DefinedBy: opts.Operator}
		var prevSQL, prevBy, idsSQL, prevIDs pgtype.Text
		if err := tx.QueryRow(ctx, `INSERT INTO `+id+`.documents AS d (index_name, sql, defined_by, ids_sql) VALUES ($1, $2, $3, $4)
			ON CONFLICT (index_name) DO UPDATE SET sql = EXCLUDED.sql, revision = d.revision + 1,
				defined_by = EXCLUDED.defined_by, defined_at = now(),
				previous_sql = d.sql, previous_by = d.defined_by, previous_at = d.defined_at,
				ids_sql = coalesce(EXCLUDED.ids_sql, d.ids_sql), previous_ids_sql = d.ids_sql
			RETURNING revision, defined_at, previous_sql, previous_by, previous_at, ids_sql, previous_ids_sql`,
			opts.Index, opts.SQL, opts.Operator, nullIfEmpty(strings.TrimSpace(opts.IDsSQL))).
			Scan(&d.Revision, &d.DefinedAt, &prevSQL, &prevBy, &d.PreviousAt, &idsSQL, &prevIDs); err != nil {
			return err
		}
		d.PreviousSQL, d.PreviousBy = prevSQL.String, prevBy.String
		d.IDsSQL, d.PreviousIDsSQL = idsSQL.String, prevIDs.String
		if _, err := tx.Exec(ctx, `CREATE OR REPLACE TRIGGER outboxd_documents_guard BEFORE INSERT ON `+id+`.events
			FOR EACH ROW EXECUTE FUNCTION `+id+`.documents_guard()`); err != nil {
			return err
		}
		return audit(ctx, tx, id, opts.Operator, "documents.define", map[string]any{
			"index": opts.Index, "revision": d.Revision, "sql": opts.SQL, "previous_sql": nullIfEmpty(d.PreviousSQL),
			"ids_sql": nullIfEmpty(d.IDsSQL), "previous_ids_sql": nullIfEmpty(d.PreviousIDsSQL),
		})
	})
	if err != nil {
		var de *DefinitionError
		if errors.As(err, &de) {
			return nil, err
		}
		return nil, fmt.Errorf("documents: define %s: %w", opts.Index, err)
	}
	return d, nil
}

// Drop removes an index's definition and the triggers watching for it,
// with an audit_log row that keeps its SQL. Refreshes of the index still
// in the outbox are then dead-lettered by the relay (no definition reads
// them); the index in Elasticsearch stays as it is. ErrNotDefined when
// the index has no definition.
func Drop(ctx context.Context, pool *pgxpool.Pool, schemaName, index, operator string) error {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return err
	}
	if strings.TrimSpace(operator) == "" {
		return &DefinitionError{Index: index, Reason: "operator: must name who acts (it goes to audit_log)"}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var sql string
		var revision int
		err := tx.QueryRow(ctx, `SELECT sql, revision FROM `+id+`.documents WHERE index_name = $1 FOR UPDATE`, index).Scan(&sql, &revision)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotDefined
		}
		if err != nil {
			return err
		}
		watches, err := listWatches(ctx, tx, id, index)
		if err != nil {
			return err
		}
		for _, w := range watches {
			if err := dropTriggers(ctx, tx, w.Trigger, w.tableSQL); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+id+`.document_watches WHERE index_name = $1`, index); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+id+`.documents WHERE index_name = $1`, index); err != nil {
			return err
		}
		var left bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+id+`.documents)`).Scan(&left); err != nil {
			return err
		}
		if !left {
			// The last definition: appends stop paying for the guard.
			if _, err := tx.Exec(ctx, `DROP TRIGGER IF EXISTS outboxd_documents_guard ON `+id+`.events`); err != nil {
				return err
			}
		}
		return audit(ctx, tx, id, operator, "documents.drop", map[string]any{
			"index": index, "revision": revision, "sql": sql, "watches": watches,
		})
	})
	if err != nil {
		return fmt.Errorf("documents: drop %s: %w", index, err)
	}
	return nil
}

// List returns every definition, with its watches, by index name.
func List(ctx context.Context, db Querier, schemaName string) ([]Definition, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT index_name, sql, revision, defined_by, defined_at,
		coalesce(previous_sql, ''), coalesce(previous_by, ''), previous_at, coalesce(ids_sql, ''), coalesce(previous_ids_sql, '')
		FROM `+id+`.documents ORDER BY index_name`)
	if err != nil {
		return nil, fmt.Errorf("documents: list: %w", err)
	}
	defs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Definition, error) {
		var d Definition
		err := r.Scan(&d.Index, &d.SQL, &d.Revision, &d.DefinedBy, &d.DefinedAt, &d.PreviousSQL, &d.PreviousBy, &d.PreviousAt, &d.IDsSQL, &d.PreviousIDsSQL)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("documents: list: %w", err)
	}
	for i := range defs {
		if defs[i].Watches, err = listWatches(ctx, db, id, defs[i].Index); err != nil {
			return nil, fmt.Errorf("documents: list: %w", err)
		}
	}
	return defs, nil
}

// Get returns one index's definition, or ErrNotDefined.
func Get(ctx context.Context, db Querier, schemaName, index string) (*Definition, error) {
	defs, err := List(ctx, db, schemaName)
	if err != nil {
		return nil, err
	}
	for i := range defs {
		if defs[i].Index == index {
			return &defs[i], nil
		}
	}
	return nil, fmt.Errorf("documents: %s: %w", index, ErrNotDefined)
}

// Querier is what the read-only functions need: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool qualify.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func audit(ctx context.Context, tx pgx.Tx, id, operator, action string, detail map[string]any) error {
	b, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+id+`.audit_log (operator, action, detail) VALUES ($1, $2, $3)`, operator, action, b)
	return err
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// checkSQL says why sql cannot be a definition, or nil: it must prepare
// with $1 as text[], return exactly (text, jsonb), and run in a READ ONLY
// transaction on an empty id list within timeout, returning no row.
func checkSQL(ctx context.Context, pool *pgxpool.Pool, sql string, timeout time.Duration) error {
	if strings.TrimSpace(sql) == "" {
		return errors.New("sql: is empty")
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("cannot reach PostgreSQL to check the SQL: %w", err)
	}
	defer conn.Release()
	pg := conn.Conn().PgConn()
	// First without a type for $1, to see whether the SQL uses $1 and as
	// what; a parameter PostgreSQL cannot type alone is typed text[].
	sd, err := pg.Prepare(ctx, "", sql, nil)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P18" {
		sd, err = pg.Prepare(ctx, "", sql, []uint32{pgtype.TextArrayOID})
	}
	if err != nil {
		return sqlError("PostgreSQL cannot prepare it", err)
	}
	switch {
	case len(sd.ParamOIDs) == 0:
		return errors.New("sql: does not use $1: it must read only the documents whose source_id is in $1 (a text[])")
	case len(sd.ParamOIDs) > 1:
		return fmt.Errorf("sql: uses %d parameters: only $1 (a text[] of source ids) is given", len(sd.ParamOIDs))
	case sd.ParamOIDs[0] != pgtype.TextArrayOID:
		return fmt.Errorf("sql: $1 is used as %s, it is a text[] of source ids (compare as t.id::text = ANY($1))", typeName(ctx, conn, sd.ParamOIDs[0]))
	}
	if len(sd.Fields) != 2 {
		names := make([]string, len(sd.Fields))
		for i, f := range sd.Fields {
			names[i] = f.Name
		}
		return fmt.Errorf("sql: returns %d columns (%s); it must return exactly two: source_id text, document jsonb", len(sd.Fields), strings.Join(names, ", "))
	}
	if oid := sd.Fields[0].DataTypeOID; oid != pgtype.TextOID {
		return fmt.Errorf("sql: its first column %q is %s, it must be text (the source_id; cast it with ::text)", sd.Fields[0].Name, typeName(ctx, conn, oid))
	}
	if oid := sd.Fields[1].DataTypeOID; oid != pgtype.JSONBOID {
		return fmt.Errorf("sql: its second column %q is %s, it must be jsonb (the document; build it with jsonb_build_object)", sd.Fields[1].Name, typeName(ctx, conn, oid))
	}
	// The trial run: in READ ONLY, so a writing definition (a data
	// modifying CTE, a function that writes) fails here and not in the
	// relay, and under a statement timeout.
	n, err := trialRun(ctx, conn, timeout, sql, []string{})
	var setup *trialSetupError
	switch {
	case errors.As(err, &setup):
		return fmt.Errorf("cannot run the SQL: %w", setup.err)
	case sqlState(err) == "25006":
		return sqlError("it is not read-only", err)
	case sqlState(err) == "57014":
		return sqlError(fmt.Sprintf("it did not finish within %v on an empty id list", timeout), err)
	case err != nil:
		return sqlError("it fails on an empty id list", err)
	case n > 0:
		return fmt.Errorf("sql: it returns %d rows for an empty id list: it must return only the documents of the ids in $1", n)
	}
	return nil
}

func sqlError(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("sql: %s: %s (SQLSTATE %s)", what, pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("sql: %s: %w", what, err)
}

func typeName(ctx context.Context, conn *pgxpool.Conn, oid uint32) string {
	var name string
	if err := conn.QueryRow(ctx, `SELECT format_type($1, NULL)`, oid).Scan(&name); err != nil {
		return fmt.Sprintf("type %d", oid)
	}
	return name
}

// trialRun runs sql once on conn in a READ ONLY transaction under timeout
// as its statement timeout, so a statement that writes (a data-modifying
// CTE, a function that writes) or hangs fails at declaration and not in
// the relay, and counts its rows. A failure to open that transaction is
// a *trialSetupError; the statement's own failure is returned as it is.
func trialRun(ctx context.Context, conn *pgxpool.Conn, timeout time.Duration, sql string, args ...any) (int, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, &trialSetupError{err}
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(1, timeout.Milliseconds()))); err != nil {
		return 0, &trialSetupError{err}
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n, rows.Err()
}

// trialSetupError means trialRun could not open its transaction.
type trialSetupError struct{ err error }

func (e *trialSetupError) Error() string { return e.err.Error() }

// sqlState is err's SQLSTATE, or "" when PostgreSQL did not answer one.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
