package rebuild

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// Status is one row of the rebuilds table, for status pages.
type Status struct {
	Index     string    `json:"index"`
	OldIndex  string    `json:"old_index"`
	NewIndex  string    `json:"new_index"`
	Phase     string    `json:"phase"`
	Copied    int64     `json:"copied"`
	Total     int64     `json:"total"`
	Rejected  int64     `json:"rejected"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Unfinished lists the rebuilds not yet done (copying, catching up or
// swapped), oldest first.
func Unfinished(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schemaName string) ([]Status, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT index_name, old_index, new_index, phase, copied, total, rejected, started_at, updated_at
FROM `+id+`.rebuilds WHERE phase IN ('copying', 'catching_up', 'swapped') ORDER BY started_at`)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return nil, nil // a schema not migrated yet has no rebuilds
	}
	if err != nil {
		return nil, fmt.Errorf("indexer: rebuilds: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Status, error) {
		var r Status
		err := row.Scan(&r.Index, &r.OldIndex, &r.NewIndex, &r.Phase, &r.Copied, &r.Total, &r.Rejected, &r.StartedAt, &r.UpdatedAt)
		return r, err
	})
}
