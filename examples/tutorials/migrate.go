package main

import (
	"context"
	"embed"
	"fmt"

	"github.com/outboxd/outboxd/schema"
)

//go:embed migrations/0001_tutorials.sql migrations/0002_authors.sql
var migrationFiles embed.FS

// DefaultSchema holds the example service's tables unless told otherwise.
const DefaultSchema = "tutorials"

// Migrate creates the service's tables in schemaName. It is safe to run
// again and concurrently: the DDL is idempotent and serialized by an
// advisory lock per schema.
func Migrate(ctx context.Context, db schema.Execer, schemaName string) error {
	var sql string
	for _, f := range []string{"migrations/0001_tutorials.sql", "migrations/0002_authors.sql"} {
		b, err := migrationFiles.ReadFile(f)
		if err != nil {
			return err
		}
		s, err := schema.Render(string(b), schemaName)
		if err != nil {
			return err
		}
		sql += s + "\n"
	}
	id, _ := schema.Ident(schemaName)
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("tutorials: migrate: begin: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('outboxd.tutorials.migrate'), hashtext($1))`, schemaName); err != nil {
		return fmt.Errorf("tutorials: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+id); err != nil {
		return fmt.Errorf("tutorials: migrate: create schema %s: %w", id, err)
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("tutorials: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("tutorials: migrate: commit: %w", err)
	}
	return nil
}
