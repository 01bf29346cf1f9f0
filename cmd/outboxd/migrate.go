package main

import (
	"context"
	"flag"
	"log/slog"

	"github.com/outboxd/outboxd/schema"
)

func init() {
	register("migrate", "create or upgrade the outbox schema (safe to run concurrently)", runMigrate)
}

func runMigrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	db := addDBFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := schema.Migrate(ctx, pool, db.schema)
	if err != nil {
		return err
	}
	slog.Info("migrated", "schema", db.schema, "applied", applied)
	return nil
}
