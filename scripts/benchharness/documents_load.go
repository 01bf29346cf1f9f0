package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/schema"
)

// docTables are the three tables of the documents scenario: parents, 5
// (or -documents-children) children per parent, and lookups joined into
// the parent's document. Parents 1..fanout share lookup 1 (the fan-out
// row); the others spread over lookups 2..1001.
type docTables struct {
	parents, children, lookups string
	defSQL, idsSQL             string
}

func newDocTables(schemaName string) (docTables, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return docTables{}, err
	}
	t := docTables{parents: id + ".parents", children: id + ".children", lookups: id + ".lookups"}
	t.defSQL = `SELECT p.id::text, jsonb_build_object('title', p.title, 'counter', p.counter, 'lookup', l.name,
  'children', (SELECT coalesce(jsonb_agg(jsonb_build_object('id', c.id, 'body', c.body) ORDER BY c.id), '[]') FROM ` + t.children + ` c WHERE c.parent_id = p.id))
FROM ` + t.parents + ` p JOIN ` + t.lookups + ` l ON l.id = p.lookup_id
WHERE p.id = ANY($1::text[]::bigint[])`
	t.idsSQL = `SELECT id FROM ` + t.parents
	return t, nil
}

// load creates and fills the tables, vacuums and checkpoints (so neither
// loader pays for hint bits), then declares the definition of index and
// the three watches, as `outboxd documents define` and `watch` would.
func (t docTables) load(ctx context.Context, pool *pgxpool.Pool, schemaName, index string, n, children, fanout, workers int) (time.Duration, error) {
	start := time.Now()
	for _, q := range []string{
		`CREATE TABLE ` + t.lookups + ` (id bigint PRIMARY KEY, name text NOT NULL)`,
		`CREATE TABLE ` + t.parents + ` (id bigint PRIMARY KEY, lookup_id bigint NOT NULL REFERENCES ` + t.lookups + `, title text NOT NULL, counter bigint NOT NULL)`,
		`CREATE TABLE ` + t.children + ` (id bigint PRIMARY KEY, parent_id bigint NOT NULL, body text NOT NULL)`,
		`INSERT INTO ` + t.lookups + ` SELECT g, 'category ' || g FROM generate_series(1, 1001) g`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("documents tables: %w", err)
		}
	}
	if err := inChunks(ctx, n, workers, func(lo, hi int64) error {
		for q, arg := range map[string]int{
			`INSERT INTO ` + t.parents + ` SELECT g, CASE WHEN g <= $3 THEN 1 ELSE 2 + g % 1000 END, 'parent ' || g, 1 FROM generate_series($1::bigint, $2::bigint) g`:                                                   fanout,
			`INSERT INTO ` + t.children + ` SELECT (g - 1) * $3 + k, g, 'child ' || k || ' of parent ' || g || ', ' || repeat('x', 40) FROM generate_series($1::bigint, $2::bigint) g, generate_series(1, $3::bigint) k`: children,
		} {
			if _, err := pool.Exec(ctx, q, lo, hi, arg); err != nil {
				return fmt.Errorf("load documents tables: %w", err)
			}
		}
		return nil
	}); err != nil {
		return 0, err
	}
	for _, q := range []string{
		`CREATE INDEX ON ` + t.children + ` (parent_id)`,
		`CREATE INDEX ON ` + t.parents + ` (lookup_id)`,
		`VACUUM (ANALYZE) ` + t.lookups, `VACUUM (ANALYZE) ` + t.parents, `VACUUM (ANALYZE) ` + t.children, `CHECKPOINT`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("load documents tables: %w", err)
		}
	}
	if _, err := documents.Define(ctx, pool, schemaName, documents.DefineOptions{Index: index, SQL: t.defSQL, IDsSQL: t.idsSQL, Operator: "bench"}); err != nil {
		return 0, err
	}
	for _, w := range []documents.WatchOptions{
		{Index: index, Table: t.parents, Key: "id"},
		{Index: index, Table: t.children, Key: "parent_id"},
		{Index: index, Table: t.lookups, Key: `SELECT p.id FROM ` + t.parents + ` p WHERE p.lookup_id = $1.id`},
	} {
		w.Operator = "bench"
		if _, err := documents.AddWatch(ctx, pool, schemaName, w); err != nil {
			return 0, err
		}
	}
	return time.Since(start), ctx.Err()
}

// handLoadDefinition is what one would write by hand without outboxd: a
// keyset cursor over the parents' ids in batches, the definition's join
// run for each batch, the documents appended to bulk bodies of bulkDocs
// plain (unversioned) index actions, workers bulk requests in flight.
func handLoadDefinition(ctx context.Context, pool *pgxpool.Pool, es *elasticsearch.Client, index string, t docTables, batch, bulkDocs, workers int) (time.Duration, error) {
	start := time.Now()
	bodies := make(chan []byte, workers)
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for body := range bodies {
				if err := rawBulk(ctx, es, index, body, false); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	readErr := func() error {
		defer close(bodies)
		var (
			after int64
			ids   = make([]string, 0, batch)
			body  []byte
			k     int
			id    string
			doc   []byte
		)
		for failed.Load() == nil {
			rows, err := pool.Query(ctx, `SELECT id FROM `+t.parents+` WHERE id > $1 ORDER BY id LIMIT $2`, after, batch)
			if err != nil {
				return err
			}
			ids = ids[:0]
			for rows.Next() {
				if err := rows.Scan(&after); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, strconv.FormatInt(after, 10))
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if len(ids) == 0 {
				break
			}
			rows, err = pool.Query(ctx, t.defSQL, ids)
			if err != nil {
				return err
			}
			for rows.Next() {
				if err := rows.Scan(&id, &doc); err != nil {
					rows.Close()
					return err
				}
				if body == nil {
					body = make([]byte, 0, 64<<10)
				}
				body = append(body, `{"index":{"_id":"`...)
				body = append(body, id...)
				body = append(body, "\"}}\n"...)
				body = append(body, doc...)
				body = append(body, '\n')
				if k++; k == bulkDocs {
					bodies <- body
					body, k = nil, 0
				}
			}
			if err := rows.Err(); err != nil {
				return err
			}
		}
		if k > 0 {
			bodies <- body
		}
		return nil
	}()
	wg.Wait()
	if readErr != nil {
		return 0, fmt.Errorf("hand-written loader: %w", readErr)
	}
	if p := failed.Load(); p != nil {
		return 0, *p
	}
	return time.Since(start), nil
}

// countMatching is the number of documents of target that query (a JSON
// query clause) matches, as searches see them now (no forced refresh).
func (b *bench) countMatching(ctx context.Context, target, query string) (int, error) {
	res, err := b.es.Count(b.es.Count.WithContext(ctx), b.es.Count.WithIndex(target),
		b.es.Count.WithBody(strings.NewReader(`{"query":`+query+`}`)))
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.IsError() {
		return 0, fmt.Errorf("count %s: %s", target, res.Status())
	}
	var c struct {
		Count int `json:"count"`
	}
	if err := json.NewDecoder(res.Body).Decode(&c); err != nil {
		return 0, fmt.Errorf("count %s: %w", target, err)
	}
	return c.Count, nil
}

// waitMatching polls countMatching until it reaches want and returns the
// time since from; it gives up after limit, or when the relay exits.
func (b *bench) waitMatching(ctx context.Context, target, query string, want int, from time.Time, limit time.Duration, p *relayProc) (time.Duration, error) {
	deadline := from.Add(limit)
	last := -1
	for {
		got, err := b.countMatching(ctx, target, query)
		if err != nil {
			return 0, err
		}
		if got >= want {
			return time.Since(from), nil
		}
		last = got
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("after %s %d of %d documents match %s: %s", limit, last, want, query, p.log.String())
		}
		if err := p.pause(ctx, 100*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// commitRefreshAll bumps every parent's counter in one transaction (its
// watch appends a refresh per parent) and returns that transaction's id.
func (b *bench) commitRefreshAll(ctx context.Context, t docTables) (string, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("refresh every parent: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE `+t.parents+` SET counter = counter + 1`); err != nil {
		return "", fmt.Errorf("refresh every parent: %w", err)
	}
	var xid string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		return "", fmt.Errorf("refresh every parent: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("refresh every parent: %w", err)
	}
	return xid, nil
}

// waitStored waits until stream's stored position is past transaction
// xid: every event of it acknowledged.
func (b *bench) waitStored(ctx context.Context, schemaName, stream, xid string, from time.Time, limit time.Duration, p *relayProc) (time.Duration, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	deadline := from.Add(limit)
	for {
		var done bool
		if err := b.pool.QueryRow(ctx, `SELECT pg_visible_in_snapshot($1::xid8, done_snapshot) FROM `+id+`.progress WHERE stream = $2`, xid, stream).Scan(&done); err != nil {
			return 0, fmt.Errorf("progress of stream %s: %w", stream, err)
		}
		if done {
			return time.Since(from), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("after %s stream %s has not passed transaction %s: %s", limit, stream, xid, p.log.String())
		}
		if err := p.pause(ctx, 20*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// settle waits (up to limit) until Elasticsearch runs no merges, so that a
// timed pass does not pay for the merges of the pass before it: the
// backfill ran right after the loader had written 1,000,000 documents, and
// took 0.77x its time at 1M against 0.9-1.0x at 300k.
func (b *bench) settle(ctx context.Context, limit time.Duration) {
	start := time.Now()
	for {
		res, err := b.es.Nodes.Stats(b.es.Nodes.Stats.WithContext(ctx), b.es.Nodes.Stats.WithMetric("indices"),
			b.es.Nodes.Stats.WithIndexMetric("merge"), b.es.Nodes.Stats.WithFilterPath("nodes.*.indices.merges.current"))
		if err != nil {
			b.rep.line("merges: %v (not waited for)", err)
			return
		}
		var st struct {
			Nodes map[string]struct {
				Indices struct {
					Merges struct {
						Current int `json:"current"`
					} `json:"merges"`
				} `json:"indices"`
			} `json:"nodes"`
		}
		err = json.NewDecoder(res.Body).Decode(&st)
		res.Body.Close()
		if err != nil {
			b.rep.line("merges: %v (not waited for)", err)
			return
		}
		running := 0
		for _, n := range st.Nodes {
			running += n.Indices.Merges.Current
		}
		waited := time.Since(start)
		if running == 0 || waited >= limit || ctx.Err() != nil {
			if waited >= time.Second {
				b.rep.line("waited %.1fs for Elasticsearch's merges to finish (%d still running)", waited.Seconds(), running)
			}
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}
