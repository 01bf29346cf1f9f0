package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema"
)

// dbFlags are the PostgreSQL flags every command shares.
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
		return nil, fmt.Errorf("database-url: not set (flag --database-url or env DATABASE_URL)")
	}
	if err := schema.ValidateName(f.schema); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(f.url)
	if err != nil {
		// pgx's parse errors can echo the URL, password included.
		return nil, fmt.Errorf("database-url: cannot be parsed as a PostgreSQL URL or DSN")
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "outboxd"
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

// esFlags are the Elasticsearch flags; secrets come only from the
// environment so they never show in ps output.
type esFlags struct {
	urls    string
	timeout time.Duration
}

func addESFlags(fs *flag.FlagSet) *esFlags {
	f := &esFlags{}
	fs.StringVar(&f.urls, "elasticsearch-url", os.Getenv("ELASTICSEARCH_URL"), "Elasticsearch node URLs, comma-separated (env ELASTICSEARCH_URL; credentials via ELASTICSEARCH_USERNAME/PASSWORD/API_KEY/CA_CERT/CERT_FINGERPRINT)")
	fs.DurationVar(&f.timeout, "elasticsearch-timeout", 30*time.Second, "Elasticsearch request timeout (env ELASTICSEARCH_TIMEOUT)")
	return f
}

func (f *esFlags) config() (indexer.ClientConfig, error) {
	c, err := indexer.ClientConfigFromEnv()
	if err != nil {
		return c, err
	}
	if f.urls != "" {
		c.Addresses = indexer.SplitAddresses(f.urls)
	}
	if c.Timeout == 0 {
		c.Timeout = f.timeout
	}
	return c, nil
}

func (f *esFlags) client() (*elasticsearch.Client, error) {
	c, err := f.config()
	if err != nil {
		return nil, err
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

// parseFlags parses args, then fills every flag the command line did not
// set from OUTBOXD_<NAME> (dashes become underscores), so each knob can be
// set either way and the command line wins.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		key := "OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(key); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %w", key, e)
			}
		}
	})
	return err
}
