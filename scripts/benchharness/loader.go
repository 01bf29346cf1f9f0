package main

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// handLoad is the loader an engineer would write instead of the relay:
// read the outbox rows from PostgreSQL in keyset pages (id > last ORDER BY
// id LIMIT page), while the previous page is being indexed, and bulk-index
// them unversioned into index with bulkDocs per request and workers in
// flight, as the relay's sink does.
func handLoad(ctx context.Context, pool *pgxpool.Pool, es *elasticsearch.Client, schemaName, index string, n, page, bulkDocs, workers int) (time.Duration, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bodies := make(chan []byte, workers)
	var failed atomic.Pointer[error]
	fail := func(err error) {
		failed.CompareAndSwap(nil, &err)
		cancel()
	}
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for body := range bodies {
				if err := rawBulk(ctx, es, index, body, false); err != nil {
					fail(err)
				}
			}
		}()
	}
	read := func() error {
		defer close(bodies)
		var last int64
		for loaded := 0; loaded < n; {
			rows, err := pool.Query(ctx, `SELECT id, source_id, document::text FROM `+id+`.events WHERE id > $1 ORDER BY id LIMIT $2`, last, page)
			if err != nil {
				return err
			}
			var body []byte
			k, got := 0, 0
			for rows.Next() {
				var sid string
				var doc []byte
				if err := rows.Scan(&last, &sid, &doc); err != nil {
					rows.Close()
					return err
				}
				body = append(body, `{"index":{"_id":`...)
				body = strconv.AppendQuote(body, sid)
				body = append(body, "}}\n"...)
				body = append(append(body, doc...), '\n')
				got++
				if k++; k == bulkDocs {
					bodies <- body
					body, k = nil, 0
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			if k > 0 {
				bodies <- body
			}
			if got == 0 {
				break
			}
			loaded += got
		}
		return nil
	}
	if err := read(); err != nil {
		fail(err)
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return 0, *p
	}
	return time.Since(start), nil
}
