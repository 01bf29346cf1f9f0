package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

const payload = `{"title":"Idempotent APIs","body":"Retries must not duplicate.","tags":["api","go"]}`

func TestIdempotentCreate(t *testing.T) {
	t.Parallel()

	t.Run("a retry with the same key and payload replays the first response", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		first := env.do(t, "POST", "/api/tutorials", "alice", "k1", payload)
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("first: want 201 not replayed, got %d replayed=%v %s", first.status, first.replayed(), first.body)
		}
		for range 3 {
			again := env.do(t, "POST", "/api/tutorials", "alice", "k1", payload)
			if again.status != http.StatusCreated || !again.replayed() {
				t.Fatalf("retry: want 201 replayed, got %d replayed=%v", again.status, again.replayed())
			}
			if !bytes.Equal(again.body, first.body) {
				t.Fatalf("retry body differs:\n first %s\n retry %s", first.body, again.body)
			}
			if again.header.Get("Location") != first.header.Get("Location") {
				t.Fatalf("retry Location %q, first %q", again.header.Get("Location"), first.header.Get("Location"))
			}
		}
		env.wantOneWrite(t)
		if got := value(env.srv.metrics.keyHits); got != 3 {
			t.Fatalf("key hits: want 3, got %v", got)
		}
		if got := value(env.srv.metrics.duplicates); got != 3 {
			t.Fatalf("duplicate requests: want 3, got %v", got)
		}
	})

	t.Run("key order and whitespace do not change the payload's identity", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		env.create(t, "alice", "k1", payload)
		reordered := `{ "tags": ["api", "go"],  "body": "Retries must not duplicate.", "title": "Idempotent APIs" }`
		r := env.do(t, "POST", "/api/tutorials", "alice", "k1", reordered)
		if r.status != http.StatusCreated || !r.replayed() {
			t.Fatalf("want a 201 replay, got %d %s", r.status, r.body)
		}
	})

	t.Run("the same key with a different payload is a 409 conflict", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		env.create(t, "alice", "k1", payload)
		r := env.do(t, "POST", "/api/tutorials", "alice", "k1", `{"title":"Something else"}`)
		if r.status != http.StatusConflict {
			t.Fatalf("want 409, got %d %s", r.status, r.body)
		}
		if e := r.apiError(t); e.Field != HeaderIdempotencyKey {
			t.Fatalf("want the error to name %s, got %+v", HeaderIdempotencyKey, e)
		}
		if n := env.rows(t); n != 1 {
			t.Fatalf("want 1 tutorial, got %d", n)
		}
		if got := value(env.srv.metrics.payloadConflicts); got != 1 {
			t.Fatalf("payload conflicts: want 1, got %v", got)
		}
	})

	t.Run("the same key on another endpoint is a conflict, not a replay", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		tut := env.create(t, "alice", "k1", payload)
		r := env.do(t, "PUT", "/api/tutorials/"+tut.ID, "alice", "k1", payload)
		if r.status != http.StatusConflict {
			t.Fatalf("want 409, got %d %s", r.status, r.body)
		}
	})

	t.Run("twenty concurrent submits with one key write exactly once", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		const n = 20
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			results = make([]response, n)
			errs    = make([]error, n)
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i], errs[i] = env.send(t, "POST", "/api/tutorials", "alice", "burst", payload)
			}()
		}
		close(start)
		wg.Wait()
		codes := map[int]int{}
		ids := map[string]bool{}
		created := 0
		for i, r := range results {
			if errs[i] != nil {
				t.Fatalf("request %d: %v", i, errs[i])
			}
			codes[r.status]++
			switch r.status {
			case http.StatusCreated:
				var tut Tutorial
				r.json(t, &tut)
				ids[tut.ID] = true
				if !r.replayed() {
					created++
				}
			case http.StatusConflict:
				if r.header.Get("Retry-After") == "" {
					t.Fatalf("a busy 409 needs Retry-After: %s", r.body)
				}
			default:
				t.Fatalf("request %d: unexpected %d %s", i, r.status, r.body)
			}
		}
		t.Logf("20 concurrent submits: %v (201 not replayed: %d)", codes, created)
		if created != 1 || len(ids) != 1 {
			t.Fatalf("want exactly one original 201 and one id, got %d originals and ids %v", created, ids)
		}
		env.wantOneWrite(t)
		if got := value(env.srv.metrics.duplicates); got != n-1 {
			t.Fatalf("duplicate requests: want %d, got %v", n-1, got)
		}
		// Whoever was told to retry now gets the first answer.
		r := env.do(t, "POST", "/api/tutorials", "alice", "burst", payload)
		if r.status != http.StatusCreated || !r.replayed() {
			t.Fatalf("after the burst: want a 201 replay, got %d %s", r.status, r.body)
		}
	})

	t.Run("another user's key is never visible", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		a := env.create(t, "alice", "shared-key", payload)
		// Same key, same payload, other user: a new operation, not a replay.
		r := env.do(t, "POST", "/api/tutorials", "bob", "shared-key", payload)
		if r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("bob: want a fresh 201, got %d replayed=%v %s", r.status, r.replayed(), r.body)
		}
		var b Tutorial
		r.json(t, &b)
		if b.ID == a.ID || b.AuthorID != "bob" {
			t.Fatalf("bob got alice's record: %+v", b)
		}
		// Same key, other payload, other user: no conflict either.
		if r := env.do(t, "POST", "/api/tutorials", "carol", "shared-key", `{"title":"Carol's"}`); r.status != http.StatusCreated {
			t.Fatalf("carol: want 201, got %d %s", r.status, r.body)
		}
		if n := env.rows(t); n != 3 {
			t.Fatalf("want 3 tutorials, got %d", n)
		}
	})

	t.Run("a request_id collision under another key returns the existing record", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		body := `{"title":"Once","request_id":"form-42"}`
		first := env.create(t, "alice", "k1", body)
		r := env.do(t, "POST", "/api/tutorials", "alice", "k2", body)
		if r.status != http.StatusOK {
			t.Fatalf("want 200 with the existing record, got %d %s", r.status, r.body)
		}
		var again Tutorial
		r.json(t, &again)
		if again.ID != first.ID {
			t.Fatalf("want the existing record %s, got %s", first.ID, again.ID)
		}
		env.wantOneWrite(t)
		if got := value(env.srv.metrics.uniqueConflicts); got != 1 {
			t.Fatalf("unique key conflicts: want 1, got %v", got)
		}
	})

	t.Run("a crash after commit but before the response replays the stored result", func(t *testing.T) {
		t.Parallel()
		var once sync.Once
		env := setup(t, func(c *Config) {
			c.afterCommit = func(*http.Request) {
				crash := false
				once.Do(func() { crash = true })
				if crash {
					// The server drops the connection without a response,
					// like a process dying right after COMMIT.
					panic(http.ErrAbortHandler)
				}
			}
		})
		if _, err := env.send(t, "POST", "/api/tutorials", "alice", "k1", payload); err == nil {
			t.Fatal("want the first request to fail without a response")
		}
		env.wantOneWrite(t)
		r := env.do(t, "POST", "/api/tutorials", "alice", "k1", payload)
		if r.status != http.StatusCreated || !r.replayed() {
			t.Fatalf("retry: want the stored 201 replayed, got %d replayed=%v %s", r.status, r.replayed(), r.body)
		}
		var tut Tutorial
		r.json(t, &tut)
		if tut.Title != "Idempotent APIs" || tut.Version != 1 {
			t.Fatalf("replayed record: %+v", tut)
		}
		if n := env.rows(t); n != 1 {
			t.Fatalf("want 1 tutorial, got %d", n)
		}
	})

	t.Run("a claim abandoned before commit is taken over once its lease ends", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		ctx := context.Background()
		norm, _ := normalize([]byte(payload))
		hash := requestHash("POST", "/api/tutorials", norm)
		// A request claimed the key and died before its transaction.
		c, err := env.srv.keys.Claim(ctx, "alice", "k1", "POST", "/api/tutorials", hash)
		if err != nil || c.kind != claimed {
			t.Fatalf("claim: %+v %v", c, err)
		}
		r := env.do(t, "POST", "/api/tutorials", "alice", "k1", payload)
		if r.status != http.StatusConflict {
			t.Fatalf("while the lease is live: want 409, got %d %s", r.status, r.body)
		}
		env.expireLease(t, "alice", "k1")
		r = env.do(t, "POST", "/api/tutorials", "alice", "k1", payload)
		if r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("after the lease: want a fresh 201, got %d %s", r.status, r.body)
		}
		// The dead owner, had it been only slow, can no longer commit.
		_, _, err = env.srv.commit(ctx, "alice", "k1", c.token, func(ctx context.Context, tx pgx.Tx) (result, error) {
			t.Fatal("the fenced owner's operation ran")
			return result{}, nil
		})
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("fenced owner: want ErrLeaseLost, got %v", err)
		}
		env.wantOneWrite(t)
	})

	t.Run("a failed write can be retried with the same key", func(t *testing.T) {
		t.Parallel()
		env := setup(t)
		missing := "/api/tutorials/00000000-0000-4000-8000-000000000000"
		r := env.do(t, "PUT", missing, "alice", "k1", payload)
		if r.status != http.StatusNotFound {
			t.Fatalf("want 404, got %d %s", r.status, r.body)
		}
		if s := env.keyStatus(t, "alice", "k1"); s != StatusFailed {
			t.Fatalf("want key FAILED, got %s", s)
		}
		r = env.do(t, "PUT", missing, "alice", "k1", payload)
		if r.status != http.StatusNotFound || r.replayed() {
			t.Fatalf("retry: want a re-run 404, got %d replayed=%v", r.status, r.replayed())
		}
	})
}

func (e *testEnv) expireLease(t testing.TB, user, key string) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), `UPDATE "`+e.tables+`".idempotency_keys
		SET locked_until = now() - interval '1 second' WHERE user_id = $1 AND key = $2`, user, key)
	if err != nil {
		t.Fatal(err)
	}
}
