package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// Options configures a Sink for one destination.
type Options struct {
	Pool        *pgxpool.Pool
	Schema      string // default "outbox"
	Destination Destination
	Client      *http.Client // nil: one built from the destination
	Metrics     *Metrics     // nil: not measured
	Logger      *slog.Logger // nil: discard
}

// Sink delivers the messages of one destination (the events of index
// outbox.MessageIndex(name)); give it a stream of its own. See the package
// doc for the ledger protocol.
type Sink struct {
	dest    Destination
	ledger  ledger
	pool    *pgxpool.Pool
	client  *http.Client
	metrics *Metrics
	log     *slog.Logger
	now     func() time.Time

	requests chan struct{} // Concurrency: requests in flight
	workers  chan struct{} // messages being handled, including backoff waits
	limit    *limiter
}

// NewSink checks o and returns the destination's sink.
func NewSink(o Options) (*Sink, error) {
	d := o.Destination
	d.setDefaults()
	if err := d.validate(); err != nil {
		return nil, err
	}
	if o.Pool == nil {
		return nil, errors.New("webhook: options: Pool is required")
	}
	if o.Schema == "" {
		o.Schema = schema.DefaultName
	}
	id, err := schema.Ident(o.Schema)
	if err != nil {
		return nil, err
	}
	if o.Client == nil {
		o.Client = newClient(d)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sink{
		dest: d, ledger: ledger{pool: o.Pool, schema: id}, pool: o.Pool, client: o.Client,
		metrics: o.Metrics, log: o.Logger, now: time.Now,
		requests: make(chan struct{}, d.Concurrency),
		// Messages waiting out a backoff hold a worker, not a request slot,
		// so one failing message never idles the destination.
		workers: make(chan struct{}, 16*d.Concurrency),
		limit:   newLimiter(d.Rate),
	}, nil
}

// Write handles a page of messages concurrently and answers for each:
// Applied once the ledger holds its final state (delivered, failed,
// skipped or unknown), Stale for a duplicate key or a replay of a message
// already final, Retry (Outage) when the ledger cannot be reached or the
// relay is shutting down.
func (s *Sink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	outs := make([]outbox.Outcome, len(events))
	// Of several messages with one key in a page, the earliest reserves
	// the key: the later ones wait for it and become its duplicates.
	first := make(map[string]chan struct{}, len(events))
	var wg sync.WaitGroup
	for i := range events {
		select {
		case s.workers <- struct{}{}:
		case <-ctx.Done():
			for j := i; j < len(events); j++ {
				outs[j] = outage(errShutdown)
			}
			wg.Wait()
			return outs, nil
		}
		before := first[events[i].SourceID]
		mine := make(chan struct{})
		if before == nil {
			first[events[i].SourceID] = mine
		}
		wg.Add(1)
		go func() {
			defer func() { close(mine); <-s.workers; wg.Done() }()
			if before != nil {
				<-before
			}
			outs[i] = s.deliver(ctx, &events[i])
		}()
	}
	wg.Wait()
	return outs, nil
}

func outage(err error) outbox.Outcome {
	return outbox.Outcome{Status: outbox.Retry, Outage: true, Reason: err.Error()}
}

var applied = outbox.Outcome{Status: outbox.Applied}

func (s *Sink) deliver(ctx context.Context, e *outbox.Event) outbox.Outcome {
	name, key := s.dest.Name, e.SourceID
	if d, ok := outbox.MessageDestination(e.IndexName); !ok || d != name {
		return outbox.Outcome{Status: outbox.Rejected, Reason: fmt.Sprintf("index %q is not a message for destination %s: check the stream's index filter", e.IndexName, name)}
	}
	initial, reason := StateReserved, ""
	if !headerSafe(key) {
		initial, reason = StateFailed, "dedupe_key: contains control characters, which cannot travel in an Idempotency-Key header"
	}
	ent, err := s.ledger.reserve(ctx, name, key, e.ID, e.Document, initial, reason)
	if err != nil {
		return outage(err)
	}
	if ent.eventID != e.ID {
		s.metrics.count(name, "duplicate")
		return outbox.Outcome{Status: outbox.Stale, Reason: fmt.Sprintf("duplicate of message %d (key %q)", ent.eventID, key)}
	}
	if ent.state != StateReserved {
		if initial != StateReserved {
			return applied
		}
		return outbox.Outcome{Status: outbox.Stale, Reason: "already " + ent.state}
	}
	done := context.WithoutCancel(ctx) // what was sent is always recorded
	if ent.inFlight {
		// A relay stopped (or lost the stream) between claiming an attempt
		// and recording its answer: the request may have been received.
		ent.uncertain = true
		if !s.dest.Idempotent {
			return s.finish(done, e, ent.attempts, StateUnknown, 0, "the relay stopped while a request was in flight: it may have been received", true)
		}
	}
	for {
		if err := s.limit.wait(ctx); err != nil {
			return outage(errShutdown)
		}
		if s.dest.Check != "" {
			ok, err := s.eligible(ctx, key, e.Document)
			var pgErr *pgconn.PgError
			switch {
			case errors.As(err, &pgErr):
				return s.finish(done, e, ent.attempts, StateFailed, 0, "check: "+pgErr.Message, ent.uncertain)
			case err != nil:
				return outage(fmt.Errorf("webhook: check: %w", err))
			case !ok:
				return s.finish(done, e, ent.attempts, StateSkipped, 0, "check returned false: not sent", ent.uncertain)
			}
		}
		select {
		case s.requests <- struct{}{}:
		case <-ctx.Done():
			return outage(errShutdown)
		}
		claimed, err := s.ledger.claim(ctx, name, key, e.ID, ent)
		if err != nil || !claimed {
			<-s.requests
			if err != nil {
				return outage(err)
			}
			return outbox.Outcome{Status: outbox.Stale, Reason: "another relay took the message over"}
		}
		n := ent.attempts + 1
		start := time.Now()
		a := s.post(done, key, e.Document)
		a.reason = s.dest.Redact(a.reason) // a url.Error or an echoing receiver quotes the URL
		<-s.requests
		s.metrics.observe(name, a, time.Since(start))
		ent.attempts, ent.inFlight = n, false
		switch a.verdict {
		case vDelivered:
			return s.finish(done, e, n, StateDelivered, a.status, "", ent.uncertain)
		case vRefused:
			return s.finish(done, e, n, StateFailed, a.status, a.reason, ent.uncertain)
		case vUncertain:
			ent.uncertain = true
			if !s.dest.Idempotent {
				return s.finish(done, e, n, StateUnknown, 0, a.reason, true)
			}
		}
		if n >= s.dest.MaxAttempts {
			final := StateFailed
			if ent.uncertain {
				final = StateUnknown
			}
			return s.finish(done, e, n, final, a.status, fmt.Sprintf("gave up after %d attempts: %s", n, a.reason), ent.uncertain)
		}
		if err := s.ledger.record(done, name, key, e.ID, n, StateReserved, a.status, a.reason, ent.uncertain); err != nil {
			return outage(err)
		}
		wait := max(backoff(s.dest.BackoffBase, s.dest.BackoffMax, n-1), min(a.retryAfter, 10*time.Minute))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return outage(errShutdown)
		}
	}
}

// finish records a final state; the relay may then acknowledge the message.
func (s *Sink) finish(ctx context.Context, e *outbox.Event, n int, state string, status int, reason string, uncertain bool) outbox.Outcome {
	if err := s.ledger.record(ctx, s.dest.Name, e.SourceID, e.ID, n, state, status, reason, uncertain); err != nil {
		return outage(err)
	}
	s.metrics.count(s.dest.Name, state)
	if state != StateDelivered {
		s.log.Warn("webhook: message not delivered", "destination", s.dest.Name, "dedupe_key", e.SourceID, "state", state, "reason", reason)
	}
	return applied
}

// eligible runs the destination's check for one message.
func (s *Sink) eligible(ctx context.Context, key string, payload []byte) (bool, error) {
	var ok *bool
	err := s.pool.QueryRow(ctx, s.dest.Check, key, string(payload)).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return ok != nil && *ok, nil
}

// backoff is base * 2^n with full jitter in [d/2, d], capped at max.
func backoff(base, maxD time.Duration, n int) time.Duration {
	d := base
	for i := 0; i < n && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	return d/2 + rand.N(d/2+1)
}

// limiter spaces requests 1/rate apart; nil means unlimited.
type limiter struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time
}

func newLimiter(rate float64) *limiter {
	if rate <= 0 {
		return nil
	}
	return &limiter{interval: time.Duration(float64(time.Second) / rate)}
}

func (l *limiter) wait(ctx context.Context) error {
	if l == nil {
		return ctx.Err()
	}
	l.mu.Lock()
	now := time.Now()
	slot := l.next
	if slot.Before(now) {
		slot = now
	}
	l.next = slot.Add(l.interval)
	l.mu.Unlock()
	if d := slot.Sub(now); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return ctx.Err()
}
