package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
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
	fs.StringVar(&f.url, "database-url", "", "PostgreSQL URL or DSN (default $DATABASE_URL)")
	fs.StringVar(&f.schema, "schema", schema.DefaultName, "outbox schema name")
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
// come from the environment (see indexer.ClientConfigFrom).
type esFlags struct{ urls string }

func addESFlags(fs *flag.FlagSet) *esFlags {
	f := &esFlags{}
	fs.StringVar(&f.urls, "elasticsearch-url", "", "Elasticsearch node URLs, comma-separated (default $ELASTICSEARCH_URL)")
	return f
}

func (f *esFlags) client() (*elasticsearch.Client, error) {
	c, err := indexer.ClientConfigFrom(os.Getenv)
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

// envAliases are the documented variables besides OUTBOXD_<FLAG>, by
// flag name, or by "command flag" where only one command's flag has one
// (the same names outboxd's own commands use).
var envAliases = map[string]string{
	"database-url":      "DATABASE_URL",
	"elasticsearch-url": "ELASTICSEARCH_URL",
	"api addr":          "OUTBOXD_API_ADDR",
	"api index":         "OUTBOXD_TUTORIALS_INDEX",
	"api cards-index":   "OUTBOXD_TUTORIALS_CARDS_INDEX",
	"demo api":          "OUTBOXD_API_URL",
}

// parseFlags parses args, then fills every flag the command line did not
// set from OUTBOXD_<NAME> (dashes become underscores) or else the flag's
// documented alias, so the command line always wins; no flag default comes
// from a variable that may hold a credential, so --help cannot print one.
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
		keys := []string{"OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))}
		for _, k := range []string{fs.Name() + " " + f.Name, f.Name} {
			if a, ok := envAliases[k]; ok {
				keys = append(keys, a)
			}
		}
		for _, key := range keys {
			if v, ok := os.LookupEnv(key); ok {
				if e := fs.Set(f.Name, v); e != nil {
					err = fmt.Errorf("%s: %w", key, e)
				}
				return
			}
		}
	})
	return err
}

// urlPassword is the password of a URL's userinfo, which the demo would
// otherwise print with the API's URL.
var urlPassword = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*):[^\s@/]*@`)

// redactWriter writes through w with URL passwords replaced by "xxxxx".
type redactWriter struct{ w io.Writer }

func (r redactWriter) Write(p []byte) (int, error) {
	if _, err := r.w.Write(urlPassword.ReplaceAll(p, []byte("${1}:xxxxx@"))); err != nil {
		return 0, err
	}
	return len(p), nil
}
