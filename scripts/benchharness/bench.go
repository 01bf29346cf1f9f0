package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema"
)

// bench is one run: its servers, what it created (to drop at the end) and
// its report.
type bench struct {
	cfg  *config
	url  string
	pool *pgxpool.Pool
	es   *elasticsearch.Client // nil when ELASTICSEARCH_URL is unset
	rep  *report
	self string // this executable, re-run as relay-child

	mu      sync.Mutex
	schemas []string
	indices []string
}

func newBench(ctx context.Context, cfg *config) (*bench, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return nil, fmt.Errorf("DATABASE_URL: not set (run eval \"$(scripts/services env)\" or use scripts/bench)")
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = 32
	pc.ConnConfig.RuntimeParams["application_name"] = "benchharness"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		pool.Close()
		return nil, err
	}
	b := &bench{cfg: cfg, url: url, pool: pool, rep: newReport(), self: self}
	if os.Getenv("ELASTICSEARCH_URL") != "" {
		ec, err := indexer.ClientConfigFrom(os.Getenv)
		if err != nil {
			pool.Close()
			return nil, err
		}
		if b.es, err = indexer.NewClient(ec); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return b, nil
}

func randomHex(n int) string {
	p := make([]byte, n)
	_, _ = rand.Read(p)
	return hex.EncodeToString(p)
}

// newSchema creates and migrates a uniquely named outbox schema.
func (b *bench) newSchema(ctx context.Context) (string, error) {
	name := "bench_" + randomHex(5)
	b.mu.Lock()
	b.schemas = append(b.schemas, name)
	b.mu.Unlock()
	if _, err := schema.Migrate(ctx, b.pool, name); err != nil {
		return "", err
	}
	return name, nil
}

// newIndexName returns a unique index name and remembers to delete every
// index starting with it.
func (b *bench) newIndexName() string {
	name := "bench-" + randomHex(5)
	b.mu.Lock()
	b.indices = append(b.indices, name)
	b.mu.Unlock()
	return name
}

func (b *bench) dropSchema(ctx context.Context, name string) {
	if b.cfg.keep {
		return
	}
	id, _ := schema.Ident(name)
	// Other engineers' tests may restart the shared server: retry for a
	// while rather than leave a large backlog behind.
	for i := 0; ; i++ {
		_, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+id+` CASCADE`)
		if err == nil {
			return
		}
		if i == 30 || ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "benchharness: drop schema %s (drop it by hand): %v\n", name, err)
			return
		}
		time.Sleep(2 * time.Second)
	}
}

// deleteIndices deletes the write index and every other index of name
// (name-000001, name-raw, ...); only names this run made.
func (b *bench) deleteIndices(ctx context.Context, name string) {
	if b.cfg.keep || b.es == nil {
		return
	}
	res, err := b.es.Indices.Delete([]string{name + "-*"}, b.es.Indices.Delete.WithContext(ctx),
		b.es.Indices.Delete.WithAllowNoIndices(true), b.es.Indices.Delete.WithIgnoreUnavailable(true))
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchharness: delete indices %s-*: %v\n", name, err)
		return
	}
	res.Body.Close()
	if res.IsError() && res.StatusCode != 404 {
		fmt.Fprintf(os.Stderr, "benchharness: delete indices %s-*: %s\n", name, res.Status())
	}
}

func (b *bench) cleanupSchemas() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b.mu.Lock()
	schemas, indices := b.schemas, b.indices
	b.schemas, b.indices = nil, nil
	b.mu.Unlock()
	for _, s := range schemas {
		b.dropSchema(ctx, s)
	}
	for _, i := range indices {
		b.deleteIndices(ctx, i)
	}
}

func (b *bench) cleanup() {
	b.cleanupSchemas()
	b.pool.Close()
}

func (b *bench) serverInfo(ctx context.Context) string {
	var v string
	_ = b.pool.QueryRow(ctx, `SELECT split_part(version(), ' ', 2)`).Scan(&v)
	var sync, fsync string
	_ = b.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('fsync')`).Scan(&sync, &fsync)
	out := "PostgreSQL " + v + " (synchronous_commit=" + sync + ", fsync=" + fsync + ")"
	if b.es != nil {
		name, _, err := indexer.Server(ctx, b.es)
		if err != nil {
			name = "search server (version unknown)"
		}
		out += ", " + name + " at " + os.Getenv("ELASTICSEARCH_URL")
	}
	return out
}
