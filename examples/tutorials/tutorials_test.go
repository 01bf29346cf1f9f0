package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// outboxRow is an event as the outbox stored it.
type outboxRow struct {
	sourceID string
	version  int64
	op       string
	title    string
}

func (e *testEnv) outboxRows(t testing.TB) []outboxRow {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT source_id, version, op, coalesce(document->>'title', '')
		FROM "`+e.outbox+`".events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.sourceID, &r.version, &r.op, &r.title); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestWrites(t *testing.T) {
	t.Parallel()

	t.Run("create, edit and delete append events at the row's versions", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		tut := env.create(t, "alice", "c", payload)
		path := "/api/tutorials/" + tut.ID

		r := env.do(t, "PUT", path, "alice", "e1", `{"title":"Edited once","body":"b"}`)
		if r.status != http.StatusOK {
			t.Fatalf("edit: %d %s", r.status, r.body)
		}
		var edited Tutorial
		r.json(t, &edited)
		if edited.Version != 2 || edited.Title != "Edited once" || len(edited.Tags) != 0 {
			t.Fatalf("edit: %+v", edited)
		}
		env.do(t, "PUT", path, "alice", "e2", `{"title":"Edited twice","body":"b"}`)

		r = env.do(t, "GET", path, "", "", "")
		var got Tutorial
		r.json(t, &got)
		if r.status != http.StatusOK || got.Version != 3 || got.Title != "Edited twice" {
			t.Fatalf("get: %d %+v", r.status, got)
		}

		r = env.do(t, "DELETE", path, "alice", "d", "")
		var del Deleted
		r.json(t, &del)
		if r.status != http.StatusOK || !del.Deleted || del.Version != 4 {
			t.Fatalf("delete: %d %s", r.status, r.body)
		}
		if r := env.do(t, "DELETE", path, "alice", "d", ""); r.status != http.StatusOK || !r.replayed() {
			t.Fatalf("retried delete: want a 200 replay, got %d %s", r.status, r.body)
		}
		if r := env.do(t, "GET", path, "", "", ""); r.status != http.StatusNotFound {
			t.Fatalf("get after delete: want 404, got %d", r.status)
		}
		if r := env.do(t, "PUT", path, "alice", "e3", `{"title":"Too late"}`); r.status != http.StatusNotFound {
			t.Fatalf("edit after delete: want 404, got %d %s", r.status, r.body)
		}

		want := []outboxRow{
			{tut.ID, 1, "upsert", "Idempotent APIs"},
			{tut.ID, 2, "upsert", "Edited once"},
			{tut.ID, 3, "upsert", "Edited twice"},
			{tut.ID, 4, "delete", ""},
		}
		got2 := env.outboxRows(t)
		if len(got2) != len(want) {
			t.Fatalf("outbox: want %v, got %v", want, got2)
		}
		for i := range want {
			if got2[i] != want[i] {
				t.Fatalf("outbox event %d: want %+v, got %+v", i, want[i], got2[i])
			}
		}
	})

	t.Run("only the author may edit or delete", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		tut := env.create(t, "alice", "c", payload)
		if r := env.do(t, "PUT", "/api/tutorials/"+tut.ID, "mallory", "e", `{"title":"Mine now"}`); r.status != http.StatusForbidden {
			t.Fatalf("edit: want 403, got %d %s", r.status, r.body)
		}
		if r := env.do(t, "DELETE", "/api/tutorials/"+tut.ID, "mallory", "d", ""); r.status != http.StatusForbidden {
			t.Fatalf("delete: want 403, got %d %s", r.status, r.body)
		}
		if n := env.events(t); n != 1 {
			t.Fatalf("want 1 event, got %d", n)
		}
	})

	t.Run("an upper-case id in the path maps to the same source_id", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		tut := env.create(t, "alice", "c", payload)
		if r := env.do(t, "DELETE", "/api/tutorials/"+strings.ToUpper(tut.ID), "alice", "d", ""); r.status != http.StatusOK {
			t.Fatalf("delete: %d %s", r.status, r.body)
		}
		for _, ev := range env.outboxRows(t) {
			if ev.sourceID != tut.ID {
				t.Fatalf("event source_id %q, want %q", ev.sourceID, tut.ID)
			}
		}
	})

	t.Run("metrics are served and count requests by route", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		env.create(t, "alice", "c", payload)
		env.do(t, "POST", "/api/tutorials", "alice", "c", payload)
		res, err := http.Get(env.ts.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		for _, want := range []string{
			`outboxd_api_requests_total{code="201",route="POST /api/tutorials"} 2`,
			`outboxd_idempotency_key_hits_total 1`,
			`outboxd_idempotency_duplicate_requests_total 1`,
			`outboxd_idempotency_payload_conflicts_total 0`,
			`outboxd_unique_key_conflicts_total 0`,
		} {
			if !strings.Contains(string(b), want) {
				t.Fatalf("metrics lack %q:\n%s", want, b)
			}
		}
	})
}

func TestDeleteExpiredKeys(t *testing.T) {
	t.Parallel()

	expire := func(t *testing.T, env *testEnv, key string) {
		t.Helper()
		_, err := env.pool.Exec(context.Background(), `UPDATE "`+env.tables+`".idempotency_keys
			SET expires_at = now() - interval '1 second' WHERE key = $1`, key)
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("expired keys are removed and live ones kept", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		for _, k := range []string{"old1", "old2", "fresh"} {
			env.create(t, "alice", k, `{"title":"`+k+`"}`)
		}
		expire(t, env, "old1")
		expire(t, env, "old2")
		n, err := DeleteExpiredKeys(context.Background(), env.pool, env.tables)
		if err != nil || n != 2 {
			t.Fatalf("want 2 deleted, got %d %v", n, err)
		}
		if left := env.count(t, `SELECT count(*) FROM "`+env.tables+`".idempotency_keys`); left != 1 {
			t.Fatalf("want 1 key left, got %d", left)
		}
		// A key reused after expiry is a new operation; the unique
		// request_id still keeps it from writing a second row.
		r := env.do(t, "POST", "/api/tutorials", "alice", "old1", `{"title":"old1"}`)
		if r.status != http.StatusOK || r.replayed() {
			t.Fatalf("want the existing record via the unique key, got %d %s", r.status, r.body)
		}
		if n := env.rows(t); n != 3 {
			t.Fatalf("want 3 rows, got %d", n)
		}
	})

	t.Run("an expired key still present is treated as new", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		env.create(t, "alice", "k", `{"title":"first","request_id":"r1"}`)
		expire(t, env, "k")
		r := env.do(t, "POST", "/api/tutorials", "alice", "k", `{"title":"second","request_id":"r2"}`)
		if r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("want a fresh 201, got %d %s", r.status, r.body)
		}
	})

	t.Run("a processing key with a live lease survives expiry", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		c, err := env.srv.keys.Claim(context.Background(), "alice", "busy", "POST", "/api/tutorials", "h")
		if err != nil || c.kind != claimed {
			t.Fatalf("claim: %+v %v", c, err)
		}
		expire(t, env, "busy")
		if n, err := env.srv.Keys().DeleteExpiredKeys(context.Background()); err != nil || n != 0 {
			t.Fatalf("want 0 deleted, got %d %v", n, err)
		}
	})

	t.Run("the scheduled job deletes expired keys", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		env.create(t, "alice", "old", `{"title":"old"}`)
		expire(t, env, "old")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stop, err := env.srv.StartCleanup(ctx, "@every 1s")
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		deadline := time.Now().Add(30 * time.Second)
		// The metric is added after the DELETE returns: wait for both.
		for env.count(t, `SELECT count(*) FROM "`+env.tables+`".idempotency_keys`) != 0 ||
			value(env.srv.metrics.expiredDeleted) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("the job did not delete the expired key within 30s (metric %v)", value(env.srv.metrics.expiredDeleted))
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("a bad schedule is refused", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		if _, err := env.srv.StartCleanup(context.Background(), "every tuesday"); err == nil {
			t.Fatal("want an error")
		}
	})
}
