package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema"
)

type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string) error) {
	commands[name] = command{summary: summary, run: run}
}

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cmd.run(ctx, os.Args[2:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "tutorials %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "Usage: tutorials <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-6s %s\n", n, commands[n].summary)
	}
}

// dbFlags name the PostgreSQL database and the outbox schema events go to.
type dbFlags struct {
	url    string
	schema string
}

func addDBFlags(fs *flag.FlagSet) *dbFlags {
	f := &dbFlags{}
	fs.StringVar(&f.url, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (env DATABASE_URL)")
	fs.StringVar(&f.schema, "schema", envOr("OUTBOXD_SCHEMA", schema.DefaultName), "outbox schema name (env OUTBOXD_SCHEMA)")
	return f
}

func (f *dbFlags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	if f.url == "" {
		return nil, errors.New("database-url: not set (flag --database-url or env DATABASE_URL)")
	}
	cfg, err := pgxpool.ParseConfig(f.url)
	if err != nil {
		// pgx's parse errors can echo the URL, password included.
		return nil, errors.New("database-url: cannot be parsed as a PostgreSQL URL or DSN")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// esFlags name the Elasticsearch cluster search reads from; credentials
// come from the environment (see indexer.ClientConfigFromEnv).
type esFlags struct{ urls string }

func addESFlags(fs *flag.FlagSet) *esFlags {
	f := &esFlags{}
	fs.StringVar(&f.urls, "elasticsearch-url", os.Getenv("ELASTICSEARCH_URL"), "Elasticsearch node URLs, comma-separated (env ELASTICSEARCH_URL)")
	return f
}

func (f *esFlags) client() (*elasticsearch.Client, error) {
	c, err := indexer.ClientConfigFromEnv()
	if err != nil {
		return nil, err
	}
	if f.urls != "" {
		c.Addresses = indexer.SplitAddresses(f.urls)
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	return indexer.NewClient(c)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envDuration(key string, def time.Duration) time.Duration {
	if v := os.Getenv(key); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}
