package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// DefaultName is the schema outboxd uses unless told otherwise.
const DefaultName = "outbox"

// Migration is one embedded SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Execer is what Migrate needs: *pgx.Conn and *pgxpool.Pool both qualify.
type Execer interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Ident returns name as a quoted SQL identifier after checking that it can
// be used as outboxd's schema name.
func Ident(name string) (string, error) {
	if err := ValidateName(name); err != nil {
		return "", err
	}
	return pgx.Identifier{name}.Sanitize(), nil
}

// ValidateName reports why name cannot be a schema name, or nil.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("schema: name: must not be empty")
	case len(name) > 63:
		return fmt.Errorf("schema: name: %d bytes, PostgreSQL allows at most 63", len(name))
	case strings.ContainsAny(name, "'$\x00"):
		// The name is spliced into SQL string literals and $$-quoted
		// function bodies, where a quote or a $ would end them early.
		return fmt.Errorf("schema: name: %q must not contain a single quote, a $ or a NUL byte", name)
	}
	return nil
}

// Render replaces {{schema}} in sql with the quoted schema name.
func Render(sql, name string) (string, error) {
	id, err := Ident(name)
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(sql, "{{schema}}", id), nil
}

// Migrations lists the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("schema: migration %q: name must start with a number and an underscore", name)
		}
		b, err := migrationFiles.ReadFile("migrations/" + name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// Migrate brings schema name up to date and returns the versions it applied.
func Migrate(ctx context.Context, db Execer, name string) ([]int, error) {
	id, err := Ident(name)
	if err != nil {
		return nil, err
	}
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema: begin: %w", err)
	}
	defer tx.Rollback(ctx)

	// The lock serializes concurrent migrators; the loser sees the winner's
	// versions once it gets the lock and applies nothing.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('outboxd.migrate'), hashtext($1))`, name); err != nil {
		return nil, fmt.Errorf("schema: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+id); err != nil {
		return nil, fmt.Errorf("schema: create schema %s: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+id+`.schema_migrations (
		version integer PRIMARY KEY,
		name text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("schema: create schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := tx.Query(ctx, `SELECT version FROM `+id+`.schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("schema: read schema_migrations: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var done []int
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		sql := strings.ReplaceAll(m.SQL, "{{schema}}", id)
		if _, err := tx.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("schema: migration %s: %w", m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+id+`.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("schema: record migration %s: %w", m.Name, err)
		}
		done = append(done, m.Version)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("schema: commit: %w", err)
	}
	return done, nil
}
