package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/webhook"
)

// The checks of outboxd check, which outboxd relay runs at start too: one
// finding per item of the configuration (PostgreSQL, the schema, the
// search server, the index spec, each destination, the admin address).
// outboxd check prints them all; the relay refuses to start on a problem
// of the configuration and starts anyway when a server does not answer
// (transient), since it waits for servers and retries.

// finding is the verdict on one item.
type finding struct {
	item   string // what was checked: "schema outbox", "destination billing"
	detail string // what was found (ok), or why it was not checked (skipped)
	err    error  // the problem; nil when ok or skipped
	// transient: the problem may go away by itself (a server that does not
	// answer, or answers an error the relay retries, such as bad search
	// credentials); outboxd check reports it, the relay starts and waits.
	transient bool
	skipped   bool // not checked: what it needs is missing
}

func okFinding(item, format string, args ...any) finding {
	return finding{item: item, detail: fmt.Sprintf(format, args...)}
}

func skippedFinding(item, format string, args ...any) finding {
	return finding{item: item, detail: fmt.Sprintf(format, args...), skipped: true}
}

// problemFinding drops from err the item's name when it starts with it
// ("destination billing: ..."), since the line names the item first.
func problemFinding(item string, err error) finding {
	return finding{item: item, err: trimmedError{err: err, msg: strings.TrimPrefix(err.Error(), item+": ")}}
}

func (f finding) problem() bool { return f.err != nil }

// trimmedError is an error with a shorter text and the same chain.
type trimmedError struct {
	err error
	msg string
}

func (e trimmedError) Error() string { return e.msg }
func (e trimmedError) Unwrap() error { return e.err }

// preflight holds one command's settings and what its checks found so far.
type preflight struct {
	db *dbFlags
	es *esFlags
	f  relayFlags

	spec      []byte // the --index-spec file's contents, once read
	specRead  bool
	dests     []parsedDestination
	destsRead bool
}

type parsedDestination struct {
	name string
	d    webhook.Destination
	err  error
}

// unreachable reports whether err says that a server did not answer, as
// opposed to answering no.
func unreachable(err error) bool {
	var ne net.Error
	var ce *pgconn.ConnectError
	return errors.As(err, &ne) || errors.As(err, &ce) || pgconn.Timeout(err) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded)
}

// beforeConnecting runs the checks that need no server: the destinations
// (without their check SQL), the index spec's file and JSON, the admin
// address. The relay refuses their problems before it waits for one.
func (p *preflight) beforeConnecting(ctx context.Context) []finding {
	return append(p.destinations(ctx, nil), p.indexSpec(ctx, nil, 0), p.adminAddr())
}

// postgres connects, once, without the relay's waiting.
func (p *preflight) postgres(ctx context.Context) (*pgxpool.Pool, finding) {
	const item = "postgres"
	cfg, err := p.db.poolConfig()
	if err != nil {
		return nil, problemFinding(item, err)
	}
	pool, err := connectPool(ctx, cfg)
	if err != nil {
		f := problemFinding(item, err)
		f.transient = !relay.IsFatal(err)
		return nil, f
	}
	var version, database string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_database()`).Scan(&version, &database); err != nil {
		pool.Close()
		f := problemFinding(item, fmt.Errorf("read the server version: %w", err))
		f.transient = unreachable(err)
		return nil, f
	}
	return pool, okFinding(item, "PostgreSQL %s at %s:%d, database %s", version, cfg.ConnConfig.Host, cfg.ConnConfig.Port, database)
}

// schemaVersion compares the schema's applied migrations with the ones
// this binary embeds: every one must be applied (outboxd migrate); newer
// ones are those of a newer outboxd during a rolling upgrade, which this
// one runs with.
func (p *preflight) schemaVersion(ctx context.Context, pool *pgxpool.Pool) finding {
	item := "schema " + p.db.schema
	if pool == nil {
		return skippedFinding(item, "PostgreSQL not reached")
	}
	st, err := schema.Inspect(ctx, pool, p.db.schema)
	if err != nil {
		f := problemFinding(item, err)
		f.transient = unreachable(err)
		return f
	}
	switch {
	case !st.Exists:
		return problemFinding(item, errors.New("not migrated (no schema_migrations table): run outboxd migrate"))
	case len(st.Pending) > 0:
		versions := make([]string, len(st.Pending))
		for i, m := range st.Pending {
			versions[i] = fmt.Sprint(m.Version)
		}
		return problemFinding(item, fmt.Errorf("migrations %s not applied: run outboxd migrate", strings.Join(versions, ", ")))
	}
	last := 0
	for _, v := range st.Applied {
		if !slices.Contains(st.Newer, v) {
			last = max(last, v)
		}
	}
	if len(st.Newer) > 0 {
		return okFinding(item, "up to date (migration %d), and %d migrations of a newer outboxd (%v)", last, len(st.Newer), st.Newer)
	}
	return okFinding(item, "up to date (migration %d)", last)
}

// search builds the client and asks the server's product and version.
// It returns the client whenever one could be built, reached or not.
func (p *preflight) search(ctx context.Context) (indexer.ClientConfig, *elasticsearch.Client, finding) {
	const item = "search"
	cfg, err := p.es.config()
	if err != nil {
		return cfg, nil, problemFinding(item, err)
	}
	client, err := indexer.NewClient(cfg)
	if err != nil {
		return cfg, nil, problemFinding(item, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	name, _, err := indexer.Server(ctx, client)
	if err != nil {
		var ce *indexer.ConfigError
		if errors.As(err, &ce) {
			return cfg, client, problemFinding(item, ce.Err)
		}
		f := problemFinding(item, fmt.Errorf("not reached (%s): %w", cfg, err))
		f.transient = true
		return cfg, client, f
	}
	if strings.HasSuffix(name, " unknown") {
		name += " version (unreadable without the monitor privilege: taken as Elasticsearch 8.18 or later)"
	}
	return cfg, client, okFinding(item, "%s, %s", name, cfg)
}

// indexSpec reads the --index-spec file and checks it here, then, with a
// client of a server that answered, has the server validate it (a
// simulated index template: nothing is created).
func (p *preflight) indexSpec(ctx context.Context, client *elasticsearch.Client, nodes int) finding {
	if p.f.indexSpec == "" {
		return okFinding("index-spec", "none given: new indices get 1 shard, 0 replicas and dynamic mappings")
	}
	item := "index-spec " + p.f.indexSpec
	if !p.specRead {
		spec, err := os.ReadFile(p.f.indexSpec)
		if err != nil {
			return problemFinding(item, fmt.Errorf("cannot be read: %w", errors.Unwrap(err)))
		}
		p.spec, p.specRead = spec, true
	}
	if err := indexer.ValidateIndexSpec(p.spec); err != nil {
		return problemFinding(item, errors.New(strings.TrimPrefix(err.Error(), "indexer: index spec: ")))
	}
	if client == nil {
		return skippedFinding(item, "valid JSON of settings and mappings; not validated by the search server, which was not reached")
	}
	err := checkIndexSpec(ctx, client, p.spec, nodes)
	if err == nil {
		return okFinding(item, "accepted by the search server (a simulated index template; nothing created)")
	}
	var se *indexer.IndexSpecError
	var re *indexer.ResponseError
	switch {
	case errors.As(err, &se):
		return problemFinding(item, fmt.Errorf("the search server refuses it: %s", se.Reason))
	case errors.As(err, &re) && re.Status == 403:
		f := problemFinding(item, fmt.Errorf("%w (simulating an index template needs the manage_index_templates privilege; the relay starts without this check)", err))
		f.transient = true
		return f
	}
	// Not reached, a server error or credentials the relay retries.
	f := problemFinding(item, err)
	f.transient = true
	return f
}

// destinations parses each --destination (its URL, its options, its
// secret present in the variable it names) and, with a pool, prepares its
// check SQL as it runs (READ ONLY, both parameters, a boolean first
// column, no writes: webhook.ValidateCheck). Nothing is sent.
func (p *preflight) destinations(ctx context.Context, pool *pgxpool.Pool) []finding {
	if !p.destsRead {
		p.destsRead = true
		for i, spec := range p.f.destinations {
			name := fmt.Sprintf("#%d", i+1)
			if n, _, ok := strings.Cut(spec, "="); ok && !strings.Contains(n, "/") {
				name = strings.TrimSpace(n)
			}
			// The secrets read are redacted too, should any library echo one.
			d, err := webhook.ParseDestination(spec, func(key string) string {
				v := os.Getenv(key)
				secrets.add(v)
				return v
			})
			if err == nil && slices.ContainsFunc(p.dests, func(o parsedDestination) bool { return o.err == nil && o.name == d.Name }) {
				err = errors.New("listed twice")
			}
			p.dests = append(p.dests, parsedDestination{name: name, d: d, err: err})
		}
	}
	if len(p.dests) == 0 {
		return []finding{okFinding("destinations", "none: messages are recorded as waiting until a relay serves their destination")}
	}
	out := make([]finding, 0, len(p.dests))
	for _, pd := range p.dests {
		item := "destination " + pd.name
		switch {
		case pd.err != nil:
			out = append(out, problemFinding(item, pd.err))
			continue
		case pd.d.Check == "":
			out = append(out, okFinding(item, "%s; no check", strings.TrimPrefix(pd.d.String(), pd.d.Name+"=")))
			continue
		case pool == nil:
			out = append(out, skippedFinding(item, "%s; check SQL not prepared: PostgreSQL not reached", strings.TrimPrefix(pd.d.String(), pd.d.Name+"=")))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := webhook.ValidateCheck(cctx, pool, pd.d)
		cancel()
		if err != nil {
			f := problemFinding(item, err)
			f.transient = unreachable(err)
			out = append(out, f)
			continue
		}
		out = append(out, okFinding(item, "%s; check SQL prepared READ ONLY with $1 and $2, boolean first column", strings.TrimPrefix(pd.d.String(), pd.d.Name+"=")))
	}
	return out
}

// adminAddr binds the admin address and lets it go: it must be free, and
// the --admin-host names valid. An address beyond loopback is a choice
// (docs/deploy.md), said, not refused.
func (p *preflight) adminAddr() finding {
	if p.f.adminAddr == "" {
		return okFinding("admin", "disabled (admin-addr is empty)")
	}
	item := "admin " + p.f.adminAddr
	bound, loopback, err := admin.CheckAddr(p.f.adminAddr, p.f.adminHosts)
	switch {
	case err != nil:
		return problemFinding(item, errors.New(strings.TrimPrefix(err.Error(), "admin: ")))
	case loopback:
		return okFinding(item, "can bind %s, on loopback (this machine only)", bound)
	case p.f.adminToken != "":
		return okFinding(item, "can bind %s, beyond loopback, behind --admin-token", bound)
	}
	return okFinding(item, "can bind %s, beyond loopback without --admin-token: only the Host check guards it, so restrict the port (a firewall, a NetworkPolicy)", bound)
}

// checkIndexSpec asks up to one node per address: a request that cannot
// reach its node sets that node aside, so the next goes to another, and one
// dead node of a cluster does not stop the relay from starting.
func checkIndexSpec(ctx context.Context, client *elasticsearch.Client, spec []byte, nodes int) error {
	for i := 1; ; i++ {
		err := indexer.CheckIndexSpec(ctx, client, spec)
		var re *indexer.ResponseError
		if err == nil || errors.As(err, &re) || i >= nodes || ctx.Err() != nil {
			return err
		}
	}
}
