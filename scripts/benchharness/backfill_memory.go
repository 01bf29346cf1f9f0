package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// backfillMemoryScenario: the peak resident set of `outboxd backfill` at
// its default flags over rows of 1 KB and of 1 MB. Batches are bounded by
// bytes as well as by rows, so the peak must not grow with the row's size:
// both must stay under the same bound, which the scenario asserts.
func (b *bench) backfillMemoryScenario(ctx context.Context) error {
	cfg := b.cfg
	if b.es == nil {
		return fmt.Errorf("ELASTICSEARCH_URL: not set")
	}
	s, err := b.newSchema(ctx)
	if err != nil {
		return err
	}
	defer b.dropSchema(ctx, s)
	var missed []string
	for _, c := range []struct {
		label     string
		rows      int
		bodyBytes int
	}{
		{"1 KB", cfg.backfillMemKBN, 1 << 10},
		{"1 MB", cfg.backfillMemMBN, 1 << 20},
	} {
		table, took, err := loadSizedRows(ctx, b.pool, s, strings.ReplaceAll(c.label, " ", ""), c.rows, c.bodyBytes)
		if err != nil {
			return err
		}
		b.rep.line("table of %d rows of %s loaded in %s", c.rows, c.label, took.Round(time.Millisecond))
		res, err := b.backfillOnce(ctx, cfg.outboxd, s, `SELECT id, version, row_to_json(t) FROM `+table+` t`, c.rows)
		if err != nil {
			return fmt.Errorf("rows of %s: %w", c.label, err)
		}
		met := res.peakKB <= int64(cfg.backfillMemPeakMB)*1024
		b.rep.goal(met, "backfill of %d rows of %s at the default flags: peak RSS (VmHWM) %s <= %d MB (%.1fs)",
			c.rows, c.label, mb(res.peakKB), cfg.backfillMemPeakMB, res.wall.Seconds())
		if !met {
			missed = append(missed, fmt.Sprintf("rows of %s: peak RSS %s", c.label, mb(res.peakKB)))
		}
	}
	if len(missed) > 0 {
		return fmt.Errorf("backfill memory over %d MB: %s", cfg.backfillMemPeakMB, strings.Join(missed, "; "))
	}
	return nil
}

// loadSizedRows creates the table <schema>.rows_<suffix> of n rows whose
// row_to_json is about bodyBytes, ids 1..n.
func loadSizedRows(ctx context.Context, pool *pgxpool.Pool, schemaName, suffix string, n, bodyBytes int) (string, time.Duration, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return "", 0, err
	}
	table := id + ".rows_" + suffix
	start := time.Now()
	// Words, not one long run of a letter: Elasticsearch analyses them as
	// it would a real body.
	word := docBody + " "
	body := strings.Repeat(word, max(1, bodyBytes/len(word)))
	for _, q := range []string{
		`CREATE TABLE ` + table + ` (id bigint PRIMARY KEY, version bigint NOT NULL, body text NOT NULL)`,
		`INSERT INTO ` + table + ` SELECT g, 1, $1::text FROM generate_series(1, ` + fmt.Sprint(n) + `) g`,
		`VACUUM (ANALYZE) ` + table,
	} {
		var args []any
		if strings.HasPrefix(q, "INSERT") {
			args = append(args, body)
		}
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			return "", 0, fmt.Errorf("load rows of %d bytes: %w", bodyBytes, err)
		}
	}
	return table, time.Since(start), nil
}
