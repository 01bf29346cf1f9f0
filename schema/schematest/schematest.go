// Package schematest gives tests real servers: a PostgreSQL pool with a fresh
// migrated outbox schema per test, and the Elasticsearch URL.
//
// Tests that need a server fail when it is missing, never skip, unless the
// caller asked for unit tests only (OUTBOXD_UNIT_ONLY=1 or go test -short).
package schematest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema"
)

// UnitOnly reports whether the caller asked to skip tests that need servers.
func UnitOnly() bool {
	return os.Getenv("OUTBOXD_UNIT_ONLY") != "" || testing.Short()
}

func need(t testing.TB, what string) {
	t.Helper()
	if UnitOnly() {
		t.Skipf("needs %s; unit tests only", what)
	}
}

// DatabaseURL returns DATABASE_URL or fails the test.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	need(t, "PostgreSQL")
	u := os.Getenv("DATABASE_URL")
	if u == "" {
		t.Fatal("DATABASE_URL is not set: run `make test`, or `scripts/services up` and `eval \"$(scripts/services env)\"`")
	}
	return u
}

// ElasticsearchURL returns ELASTICSEARCH_URL after checking it answers, or fails the test.
func ElasticsearchURL(t testing.TB) string {
	t.Helper()
	need(t, "Elasticsearch")
	u := os.Getenv("ELASTICSEARCH_URL")
	if u == "" {
		t.Fatal("ELASTICSEARCH_URL is not set: run `make test`, or `scripts/services up` and `eval \"$(scripts/services env)\"`")
	}
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("Elasticsearch at ELASTICSEARCH_URL does not answer: %v", err)
	}
	resp.Body.Close()
	return u
}

// Pool connects to DATABASE_URL and closes the pool when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DatabaseURL(t))
	if err != nil {
		t.Fatalf("DATABASE_URL: %v", err)
	}
	cfg.MaxConns = 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("PostgreSQL at DATABASE_URL does not answer: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Name returns a unique lowercase name with the given prefix, usable as a
// schema or Elasticsearch index name.
func Name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Setup returns a pool and the name of a freshly migrated outbox schema
// that is dropped when the test ends (kept when OUTBOXD_KEEP=1).
func Setup(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	pool := Pool(t)
	name := Name("t_")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := schema.Migrate(ctx, pool, name); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	t.Cleanup(func() {
		if os.Getenv("OUTBOXD_KEEP") != "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+name+`" CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", name, err)
		}
	})
	return pool, name
}

// Eventually polls cond until it holds, failing the test with what after
// timeout: the one wait helper of the suite.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
