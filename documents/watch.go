package documents

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// Watch is the triggers outboxd installed on a contributing table: every
// INSERT, UPDATE and DELETE statement appends a refresh of each source id
// the key returns for the rows it changed (for the old and the new rows
// of an UPDATE, each id once per statement). They are statement-level
// triggers with transition tables, one per event: Trigger (UPDATE),
// Trigger_insert and Trigger_delete.
type Watch struct {
	Index     string    `json:"index"`
	Table     string    `json:"table"`
	Key       string    `json:"key"`     // as given
	KeySQL    string    `json:"key_sql"` // the query the trigger (or, for a SELECT, the relay) runs, $1 the row
	Trigger   string    `json:"trigger"`
	WatchedBy string    `json:"watched_by"`
	WatchedAt time.Time `json:"watched_at"`

	tableSQL string // the table as SQL names it now
}

// WatchOptions install a watch.
type WatchOptions struct {
	Index string
	Table string // as SQL names it: authors, public.authors, "My Table"
	// Key names the source ids of Index that a row of Table contributes
	// to, with $1 standing for the row, in one of three forms:
	//   - a column of the table: tutorial_id (one id per row);
	//   - an expression over $1: $1.tutorial_id, or ($1).a || '-' || ($1).b;
	//   - a query starting with SELECT or WITH, one column, any number of
	//     rows: SELECT t.id FROM tutorials t WHERE t.author_id = $1.id.
	// NULL ids are skipped; ids are cast to text.
	Key      string
	Operator string
}

var (
	columnKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	queryKey  = regexp.MustCompile(`(?is)^\s*(select|with)\b`)
)

// AddWatch checks the key against the table and installs (or replaces)
// the table's trigger for the index, with an audit_log row. The index
// must have a definition. TRUNCATE is not watched: run a backfill after
// one.
func AddWatch(ctx context.Context, pool *pgxpool.Pool, schemaName string, opts WatchOptions) (*Watch, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	fail := func(reason string, err error) (*Watch, error) {
		return nil, &DefinitionError{Index: opts.Index, Reason: reason, Err: err}
	}
	if strings.TrimSpace(opts.Operator) == "" {
		return fail("operator: must name who acts (it goes to audit_log)", nil)
	}
	if strings.TrimSpace(opts.Key) == "" {
		return fail("key: is empty", nil)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("documents: watch: %w", err)
	}
	defer conn.Release()
	var defined bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+id+`.documents WHERE index_name = $1)`, opts.Index).Scan(&defined); err != nil {
		return nil, fmt.Errorf("documents: watch: %w", err)
	}
	if !defined {
		return fail("has no document definition: define it first (outboxd documents define)", ErrNotDefined)
	}
	var tableOID, rowType uint32
	var tableSQL string
	err = conn.QueryRow(ctx, `SELECT c.oid, c.reltype, c.oid::regclass::text FROM pg_class c
		WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')`, opts.Table).Scan(&tableOID, &rowType, &tableSQL)
	if errors.Is(err, pgx.ErrNoRows) {
		return fail(fmt.Sprintf("table: %q is not a table this database knows (on the search_path, or schema-qualified)", opts.Table), nil)
	}
	if err != nil {
		return nil, fmt.Errorf("documents: watch: %w", err)
	}
	keySQL, mode, err := keyQuery(ctx, conn, tableOID, opts.Key)
	if err != nil {
		return fail(err.Error(), nil)
	}
	if mode == "row" && !skipKeyFormRule {
		if err := keyForm(opts.Key); err != nil {
			return fail(err.Error(), nil)
		}
	}
	if err := checkKey(ctx, conn.Conn().PgConn(), keySQL, rowType); err != nil {
		return fail(err.Error(), errors.Unwrap(err))
	}
	w := &Watch{Index: opts.Index, Table: tableSQL, Key: opts.Key, KeySQL: keySQL, Trigger: triggerName(opts.Index), WatchedBy: opts.Operator, tableSQL: tableSQL}
	var refused error
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// The statement the trigger will EXECUTE, built by the same
		// function, over no rows: a key its $1 rewrite breaks is refused
		// here, and the transaction installs nothing.
		if _, err := tx.Exec(ctx, `SELECT `+id+`.watch_check($1::oid::regclass, $2, $3)`, tableOID, keySQL, mode); err != nil {
			refused = keyError("the trigger cannot run it (with $1 rewritten to each changed row)", err)
			return err
		}
		// Three statement-level triggers (see watch_install in migration
		// 0040): the key runs once per statement over its transition tables.
		if _, err := tx.Exec(ctx, `SELECT `+id+`.watch_install($1::oid::regclass, $2, $3, $4, $5)`,
			tableOID, w.Trigger, opts.Index, keySQL, mode); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `INSERT INTO `+id+`.document_watches AS w (index_name, tbl, key, key_sql, trigger_name, watched_by)
			VALUES ($1, $2::oid::regclass, $3, $4, $5, $6)
			ON CONFLICT (index_name, tbl) DO UPDATE SET key = EXCLUDED.key, key_sql = EXCLUDED.key_sql,
				trigger_name = EXCLUDED.trigger_name, watched_by = EXCLUDED.watched_by, watched_at = now()
			RETURNING watched_at`, opts.Index, tableOID, opts.Key, keySQL, w.Trigger, opts.Operator).Scan(&w.WatchedAt); err != nil {
			return err
		}
		return audit(ctx, tx, id, opts.Operator, "documents.watch", map[string]any{
			"index": opts.Index, "table": tableSQL, "key": opts.Key, "key_sql": keySQL,
		})
	})
	if refused != nil {
		return fail(refused.Error(), err)
	}
	if err != nil {
		return nil, fmt.Errorf("documents: watch %s on %s: %w", opts.Index, tableSQL, err)
	}
	return w, nil
}

// RemoveWatch drops the index's trigger on table, with an audit_log row.
func RemoveWatch(ctx context.Context, pool *pgxpool.Pool, schemaName, index, table, operator string) error {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return err
	}
	if strings.TrimSpace(operator) == "" {
		return &DefinitionError{Index: index, Reason: "operator: must name who acts (it goes to audit_log)"}
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var w Watch
		err := tx.QueryRow(ctx, `DELETE FROM `+id+`.document_watches WHERE index_name = $1 AND tbl = to_regclass($2)
			RETURNING tbl::text, key, trigger_name`, index, table).Scan(&w.Table, &w.Key, &w.Trigger)
		if errors.Is(err, pgx.ErrNoRows) {
			return &DefinitionError{Index: index, Reason: fmt.Sprintf("table: %s is not watched for it", table)}
		}
		if err != nil {
			return err
		}
		if err := dropTriggers(ctx, tx, w.Trigger, w.Table); err != nil {
			return err
		}
		return audit(ctx, tx, id, operator, "documents.unwatch", map[string]any{"index": index, "table": w.Table, "key": w.Key})
	})
}

// dropTriggers drops a watch's triggers: name (UPDATE, and every event
// before migration 0040 made watches statement-level), name_insert and
// name_delete.
func dropTriggers(ctx context.Context, tx pgx.Tx, name, table string) error {
	for _, n := range []string{name, name + "_insert", name + "_delete"} {
		if _, err := tx.Exec(ctx, `DROP TRIGGER IF EXISTS `+pgx.Identifier{n}.Sanitize()+` ON `+table); err != nil {
			return err
		}
	}
	return nil
}

func listWatches(ctx context.Context, db Querier, id, index string) ([]Watch, error) {
	rows, err := db.Query(ctx, `SELECT index_name, tbl::text, key, key_sql, trigger_name, watched_by, watched_at
		FROM `+id+`.document_watches WHERE index_name = $1 ORDER BY tbl::text`, index)
	if err != nil {
		return nil, err
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Watch, error) {
		var w Watch
		err := r.Scan(&w.Index, &w.Table, &w.Key, &w.KeySQL, &w.Trigger, &w.WatchedBy, &w.WatchedAt)
		w.tableSQL = w.Table
		return w, err
	})
	if ws == nil {
		ws = []Watch{}
	}
	return ws, err
}

// triggerName is one name per index, the same on every table: a table may
// be watched for several indexes, and index names are longer than
// PostgreSQL's 63-byte identifiers.
func triggerName(index string) string {
	h := sha256.Sum256([]byte(index))
	return "outboxd_watch_" + hex.EncodeToString(h[:8])
}

// keyQuery turns a key in any of its forms into a query with $1 the row,
// and says how the trigger runs it: "row" (a column or an expression,
// which read only the row: the trigger refreshes their ids itself) or
// "query" (a SELECT, which reads other tables: the relay runs it in its
// read's snapshot, see refresh_watched in the migration).
func keyQuery(ctx context.Context, conn *pgxpool.Conn, table uint32, key string) (sql, mode string, err error) {
	key = strings.TrimSpace(key)
	switch {
	case queryKey.MatchString(key):
		return key, "query", nil
	case columnKey.MatchString(key):
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped)`,
			table, key).Scan(&ok); err != nil {
			return "", "", err
		}
		if !ok {
			return "", "", fmt.Errorf("key: the table has no column %q (a column name, an expression over $1, or a SELECT)", key)
		}
		return "SELECT $1." + pgx.Identifier{key}.Sanitize(), "row", nil
	}
	return "SELECT (" + key + ")", "row", nil
}

// checkKey prepares the key with $1 typed as the table's row: it must use
// $1, return one column, and that column must cast to text.
func checkKey(ctx context.Context, pg *pgconn.PgConn, keySQL string, rowType uint32) error {
	// Untyped first, only to see whether it uses $1 at all ($1.col
	// cannot be typed alone, and that failure says nothing).
	if sd, err := pg.Prepare(ctx, "", keySQL, nil); err == nil && len(sd.ParamOIDs) == 0 {
		return errors.New("key: does not use $1 (the changed row): it would refresh the same ids for every row")
	}
	sd, err := pg.Prepare(ctx, "", keySQL, []uint32{rowType})
	if err != nil {
		return keyError("PostgreSQL cannot prepare it with $1 the table's row", err)
	}
	if len(sd.ParamOIDs) != 1 {
		return fmt.Errorf("key: uses %d parameters: only $1 (the changed row) is given", len(sd.ParamOIDs))
	}
	if len(sd.Fields) != 1 {
		return fmt.Errorf("key: returns %d columns: it must return one, the source id", len(sd.Fields))
	}
	if _, err := pg.Prepare(ctx, "", `SELECT k::text FROM (`+keySQL+`) AS q(k)`, []uint32{rowType}); err != nil {
		return keyError("its column does not cast to text", err)
	}
	return nil
}

func keyError(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("key: %s: %s (SQLSTATE %s)", what, pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("key: %s: %w", what, err)
}
