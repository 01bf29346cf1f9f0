package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what Inspect needs: *pgx.Conn and *pgxpool.Pool both qualify.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Status is how a schema's applied migrations compare with the ones this
// binary embeds.
type Status struct {
	// Exists: the schema has a schema_migrations table (Migrate ran).
	Exists  bool
	Applied []int       // versions recorded, ascending
	Pending []Migration // embedded, not applied: run Migrate
	// Newer are applied versions this binary does not know: a newer
	// outboxd migrated the schema (as during a rolling upgrade).
	Newer []int
}

// UpToDate reports whether every embedded migration is applied.
func (s Status) UpToDate() bool { return s.Exists && len(s.Pending) == 0 }

// Inspect reads the schema_migrations of schema name and changes nothing.
func Inspect(ctx context.Context, db Querier, name string) (Status, error) {
	id, err := Ident(name)
	if err != nil {
		return Status{}, err
	}
	ms, err := Migrations()
	if err != nil {
		return Status{}, err
	}
	var table *string
	if err := db.QueryRow(ctx, `SELECT to_regclass($1)::text`, id+".schema_migrations").Scan(&table); err != nil {
		return Status{}, fmt.Errorf("schema: look for %s.schema_migrations: %w", id, err)
	}
	if table == nil {
		return Status{Pending: ms}, nil
	}
	rows, err := db.Query(ctx, `SELECT version FROM `+id+`.schema_migrations ORDER BY version`)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return Status{}, fmt.Errorf("schema: read %s.schema_migrations: %s (SQLSTATE %s)", id, pgErr.Message, pgErr.Code)
		}
		return Status{}, fmt.Errorf("schema: read %s.schema_migrations: %w", id, err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return Status{}, fmt.Errorf("schema: read %s.schema_migrations: %w", id, err)
	}
	st := Status{Exists: true, Applied: applied}
	known, have := map[int]bool{}, map[int]bool{}
	for _, v := range applied {
		have[v] = true
	}
	for _, m := range ms {
		known[m.Version] = true
		if !have[m.Version] {
			st.Pending = append(st.Pending, m)
		}
	}
	for _, v := range applied {
		if !known[v] {
			st.Newer = append(st.Newer, v)
		}
	}
	return st, nil
}
