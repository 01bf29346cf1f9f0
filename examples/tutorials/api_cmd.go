package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outboxd/webhook"
)

func init() {
	register("api", "run the tutorials API (idempotent writes through the outbox)", runExampleAPI)
}

func runExampleAPI(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("api", flag.ContinueOnError)
	db := addDBFlags(fs)
	es := addESFlags(fs)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address (or $OUTBOXD_API_ADDR); loopback by default: X-User-ID is trusted as is")
	tables := fs.String("tutorials-schema", DefaultSchema, "schema of the tutorials and idempotency_keys tables, created at start")
	index := fs.String("index", DefaultIndex, "index_name of the events; search reads <index> (or $OUTBOXD_TUTORIALS_INDEX)")
	cards := fs.String("cards-index", DefaultCardsIndex, "definition-fed index of tutorial cards (author names joined in), declared at start (or $OUTBOXD_TUTORIALS_CARDS_INDEX); empty declares none")
	ttl := fs.Duration("key-ttl", DefaultKeyTTL, "how long idempotency keys are remembered")
	lease := fs.Duration("key-lease", DefaultLease, "how long a PROCESSING key is protected before a retry may take it over")
	schedule := fs.String("key-cleanup-schedule", DefaultCleanupSchedule, "cron schedule of the expired-key job, e.g. '@every 10m' or '0 * * * *'")
	notify := fs.String("notify-destination", "", "webhook destination (as configured on outboxd relay --destination) told of every new tutorial, in the creating transaction; empty sends nothing")
	secretEnv := fs.String("webhook-secret-env", "OUTBOXD_TUTORIALS_WEBHOOK_SECRET", "environment variable holding the secret that POST /api/webhooks verifies (whsec_<base64> or raw); unset disables the endpoint")
	previousEnv := fs.String("webhook-previous-secret-env", "OUTBOXD_TUTORIALS_WEBHOOK_PREVIOUS_SECRET", "environment variable holding the sender's previous secret, also accepted while it rotates; unset accepts only the current one")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var secret []byte
	if v := os.Getenv(*secretEnv); v != "" {
		var err error
		if secret, err = webhook.ParseSecret(v); err != nil {
			return fmt.Errorf("webhook-secret-env: %s: %w", *secretEnv, err)
		}
	}
	var previous []byte
	if v := os.Getenv(*previousEnv); v != "" {
		var err error
		if previous, err = webhook.ParseSecret(v); err != nil {
			return fmt.Errorf("webhook-previous-secret-env: %s: %w", *previousEnv, err)
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *ttl <= 0 {
		return fmt.Errorf("key-ttl: must be positive, got %s", *ttl)
	}
	if *lease <= 0 {
		return fmt.Errorf("key-lease: must be positive, got %s", *lease)
	}

	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Migrate(ctx, pool, *tables); err != nil {
		return err
	}
	if *cards != "" {
		if err := DeclareCards(ctx, pool, *tables, db.schema, *cards, "tutorials api"); err != nil {
			return err
		}
	}
	client, err := es.client()
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := New(Config{
		Pool:          pool,
		Schema:        *tables,
		OutboxSchema:  db.schema,
		Index:         *index,
		CardsIndex:    *cards,
		Elasticsearch: client,
		KeyTTL:        *ttl,
		Lease:         *lease,
		Registerer:    reg,
		Gatherer:      reg,
		Logger:        slog.Default(),
		WebhookSecret: secret, WebhookPreviousSecret: previous,
		Notify: *notify,
	})
	if err != nil {
		return err
	}
	stopCleanup, err := srv.StartCleanup(ctx, *schedule)
	if err != nil {
		return err
	}
	defer stopCleanup()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("addr: %w", err)
	}
	hs := srv.HTTPServer()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	slog.Info("example API listening", "addr", "http://"+ln.Addr().String(), "tables", *tables, "outbox", db.schema, "index", *index)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdown); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
