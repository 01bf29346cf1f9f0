package webhook_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/webhook"
)

// BenchmarkWebhookDrain sends a 20,000-message backlog to a fast loopback
// receiver through the relay and the webhook sink (8 requests in flight),
// then the same backlog with a hand-written loop of 8 workers, each
// claiming one row (SELECT ... FOR UPDATE SKIP LOCKED), POSTing it and
// marking it sent in the same transaction. Both in one run, on the same
// servers; compare the ratio. Run with
//
//	go test -bench WebhookDrain -benchtime 1x -run '^$' ./webhook/
func BenchmarkWebhookDrain(b *testing.B) {
	const n, workers = 20000, 8
	ctx := context.Background()
	var received atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()

	for range b.N {
		e := setup(b)
		if _, err := e.pool.Exec(ctx, `SELECT "`+e.schema+`".append_message('bench', 'm' || g, jsonb_build_object('n', g, 'text', repeat('x', 100)))
			FROM generate_series(1, $1::int) g`, n); err != nil {
			b.Fatal(err)
		}
		d := destination("bench", rcv.URL, false)
		d.Concurrency = workers
		ss, err := streams(e.pool, e.schema, d)
		if err != nil {
			b.Fatal(err)
		}
		cfg := relayConfig(e.pool, e.schema, ss)
		cfg.MaxBatchDocs = 2000
		received.Store(0)
		began := time.Now()
		stop := start(b, cfg)
		for {
			var done int
			if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".deliveries WHERE state = 'delivered'`).Scan(&done); err != nil {
				b.Fatal(err)
			}
			if done == n {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		relayTook := time.Since(began)
		stop()
		if got := received.Load(); got != n {
			b.Fatalf("the receiver got %d requests for %d messages", got, n)
		}

		if _, err := e.pool.Exec(ctx, `CREATE TABLE "`+e.schema+`".jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
				key text NOT NULL, payload jsonb NOT NULL, state text NOT NULL DEFAULT 'pending');
			CREATE INDEX ON "`+e.schema+`".jobs (id) WHERE state = 'pending';
			INSERT INTO "`+e.schema+`".jobs (key, payload) SELECT 'm' || g, jsonb_build_object('n', g, 'text', repeat('x', 100)) FROM generate_series(1, `+strconv.Itoa(n)+`) g;
			ANALYZE "`+e.schema+`".jobs`); err != nil {
			b.Fatal(err)
		}
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
		received.Store(0)
		began = time.Now()
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					more, err := naiveOne(ctx, e, client, rcv.URL)
					if err != nil {
						b.Error(err)
						return
					}
					if !more {
						return
					}
				}
			}()
		}
		wg.Wait()
		loopTook := time.Since(began)
		if got := received.Load(); got != n {
			b.Fatalf("the loop sent %d requests for %d messages", got, n)
		}
		relayRate, loopRate := float64(n)/relayTook.Seconds(), float64(n)/loopTook.Seconds()
		b.ReportMetric(relayRate, "relay-msgs/s")
		b.ReportMetric(loopRate, "skiplocked-msgs/s")
		b.ReportMetric(relayRate/loopRate, "ratio")
		b.Logf("%d messages: relay + webhook sink %s (%.0f/s), SKIP LOCKED loop %s (%.0f/s): %.2fx",
			n, relayTook.Round(time.Millisecond), relayRate, loopTook.Round(time.Millisecond), loopRate, relayRate/loopRate)
	}
}

// naiveOne is one turn of the hand-written loop: claim, POST, mark sent.
func naiveOne(ctx context.Context, e *env, client *http.Client, url string) (bool, error) {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	var id int64
	var key string
	var payload []byte
	err = tx.QueryRow(ctx, `SELECT id, key, payload::text FROM "`+e.schema+`".jobs WHERE state = 'pending'
		ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id, &key, &payload)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(payload))
	ts := time.Now().Unix()
	req.Header.Set(webhook.HeaderIdempotencyKey, key)
	req.Header.Set(webhook.HeaderID, key)
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(secret, key, ts, payload))
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	if _, err := tx.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET state = 'sent' WHERE id = $1`, id); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}
