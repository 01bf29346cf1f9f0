package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// The document of event g is about 100 bytes. docBody keeps SQL and Go in
// agreement: rawDoc is byte for byte what jsonb prints for the SQL one, so
// the raw loader sends exactly what the relay reads back.
const docBody = "lorem ipsum dolor sit amet, consectetur adipiscing elit"

func rawDoc(g int64) []byte {
	b := make([]byte, 0, 112)
	b = append(b, `{"n": `...)
	b = strconv.AppendInt(b, g, 10)
	b = append(b, `, "body": "`+docBody+`", "title": "tutorial `...)
	b = strconv.AppendInt(b, g, 10)
	return append(b, `"}`...)
}

func sourceID(g int64) string { return "doc-" + strconv.FormatInt(g, 10) }

// loadBacklog appends events from..from+n-1 to the schema's outbox with
// INSERT ... SELECT generate_series, txSize events per transaction on
// workers connections: as fast as PostgreSQL takes them, yet with many
// transactions like a real producer's.
func loadBacklog(ctx context.Context, pool *pgxpool.Pool, schemaName, index string, from, n int64, txSize, workers int) (time.Duration, error) {
	return load(ctx, pool, schemaName, index, from, n, txSize, workers, true)
}

// smallDocSQL is rawDoc(g) in SQL.
const smallDocSQL = `jsonb_build_object('n', g, 'body', '` + docBody + `'::text, 'title', 'tutorial ' || g)`

// load is loadBacklog; checkpoint false leaves out the CHECKPOINT (the WAL
// scenario reads the WAL it measured, which a checkpoint may recycle).
func load(ctx context.Context, pool *pgxpool.Pool, schemaName, index string, from, n int64, txSize, workers int, checkpoint bool) (time.Duration, error) {
	return loadDocs(ctx, pool, schemaName, index, from, n, txSize, workers, checkpoint, smallDocSQL)
}

// loadDocs is load with docSQL, an expression of g, as each document.
func loadDocs(ctx context.Context, pool *pgxpool.Pool, schemaName, index string, from, n int64, txSize, workers int, checkpoint bool, docSQL string) (time.Duration, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	sql := `INSERT INTO ` + id + `.events (index_name, source_id, version, op, document)
		SELECT $1, 'doc-' || g, 1, 'upsert', ` + docSQL + `
		FROM generate_series($2::bigint, $3::bigint) g`
	start := time.Now()
	var next atomic.Int64
	next.Store(from)
	end := from + n
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := next.Add(int64(txSize)) - int64(txSize)
				if lo >= end || ctx.Err() != nil {
					return
				}
				hi := min(lo+int64(txSize), end) - 1
				if _, err := pool.Exec(ctx, sql, index, lo, hi); err != nil {
					errs <- fmt.Errorf("load backlog: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	// Statistics as autovacuum would soon have them; the relay's plans
	// should not depend on a lucky moment.
	if _, err := pool.Exec(ctx, `ANALYZE `+id+`.events`); err != nil {
		return 0, fmt.Errorf("analyze: %w", err)
	}
	// A large load leaves hundreds of MB of dirty buffers and a checkpoint
	// due: flush them now, or the checkpoint's writes (and Elasticsearch's
	// translog fsyncs waiting behind them) would be charged to whatever is
	// measured next. A backlog that built up over hours would not carry
	// them either.
	if !checkpoint {
		return elapsed, nil
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return 0, fmt.Errorf("checkpoint: %w", err)
	}
	return elapsed, nil
}

// copyQueue makes a plain queue table (the naive and peer baselines' own
// backlog) holding the first n events of the outbox, keyed by id.
func copyQueue(ctx context.Context, pool *pgxpool.Pool, schemaName, table string, n int) error {
	id, _ := schema.Ident(schemaName)
	for _, sql := range []string{
		`CREATE TABLE ` + id + `.` + table + ` AS SELECT id, xid, index_name, source_id, version, op, document, event_type, headers, occurred_at, created_at
			FROM ` + id + `.events WHERE id <= ` + strconv.Itoa(n),
		`ALTER TABLE ` + id + `.` + table + ` ADD PRIMARY KEY (id)`,
		`ANALYZE ` + id + `.` + table,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("copy queue %s: %w", table, err)
		}
	}
	return nil
}

// walLSN is the current WAL insert position in bytes.
func walLSN(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var lsn int64
	err := pool.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&lsn)
	return lsn, err
}

// otherSessions counts sessions of other clients that are running a
// statement or hold a transaction open right now: a hint that WAL numbers
// may include someone else's writes.
func otherSessions(ctx context.Context, pool *pgxpool.Pool) int {
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
		  AND state <> 'idle' AND coalesce(application_name, '') <> 'benchharness'`).Scan(&n)
	return n
}
