package main

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// cutOffWrite starts a create whose transaction is held mid-way (a row of
// the test's own, uncommitted, takes its request_id), lets cut end the
// database session(s) under it, and checks that a retry with the same key
// and payload succeeds at once with exactly one row.
func cutOffWrite(t *testing.T, env *testEnv, cut func(serverPID int)) {
	t.Helper()
	ctx := context.Background()
	blocker, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `INSERT INTO "`+env.tables+`".tutorials (author_id, request_id, title) VALUES ('alice', 'cut', 'blocker')`); err != nil {
		t.Fatal(err)
	}
	first := make(chan response, 1)
	go func() {
		r, err := env.send(t, "POST", "/api/tutorials", "alice", "cut", payload)
		if err != nil {
			t.Error(err)
		}
		first <- r
	}()
	var pid int
	deadline := time.Now().Add(10 * time.Second)
	for pid == 0 {
		_ = env.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%tutorials%'`, env.tables).Scan(&pid)
		if time.Now().After(deadline) {
			t.Fatal("the write never reached its business insert")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cut(pid)
	if r := <-first; r.status != http.StatusInternalServerError {
		t.Fatalf("the cut-off write: want 500, got %d %s", r.status, r.body)
	}
	_ = blocker.Rollback(ctx)
	for deadline := time.Now().Add(time.Minute); env.pool.Ping(ctx) != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("PostgreSQL did not answer again")
		}
	}
	r := env.do(t, "POST", "/api/tutorials", "alice", "cut", payload)
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("the retry: want a fresh 201, got %d %s", r.status, r.body)
	}
	env.wantOneWrite(t)
}

func TestIdempotentCutOff(t *testing.T) {
	t.Parallel()

	t.Run("a retry of a write whose session was killed mid-transaction succeeds at once with one row", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		cutOffWrite(t, env, func(pid int) {
			if _, err := env.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
		})
	})
}
