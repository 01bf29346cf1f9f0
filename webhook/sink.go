package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

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
// outbox.MessageIndex(name)); give it a stream of its own, and run Lead
// while that stream is led (package relay does: Sink is a
// relay.LeaderWork), or parked messages are never retried. See the
// package doc for the ledger protocol.
type Sink struct {
	dest    Destination
	ledger  ledger
	pool    *pgxpool.Pool
	client  *http.Client
	metrics *Metrics
	log     *slog.Logger
	now     func() time.Time

	requests   chan struct{} // Concurrency: requests in flight
	checkSlots chan struct{} // connections the checks of this pool may hold
	workers    chan struct{} // messages being handled, including backoff waits
	limit      *limiter
	breaker    *breaker
	retryWake  chan struct{} // a message was parked: Lead looks for what is due

	keysMu sync.Mutex
	keys   map[string]chan struct{} // keys a Write of this sink is delivering; closed when done
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
	if d.Check != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := validateCheck(ctx, o.Pool, d)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	metrics, log := o.Metrics, o.Logger
	changed := func(open bool) {
		metrics.circuit(d.Name, open)
		if open {
			log.Warn("webhook: destination paused: its receiver keeps failing; a probe follows the cool-down", "destination", d.Name,
				"consecutive_failures", d.BreakerFailures, "cooldown", d.BreakerCooldown)
		} else {
			log.Info("webhook: destination resumed: the probe succeeded", "destination", d.Name)
		}
	}
	return &Sink{
		breaker:    newBreaker(d.BreakerFailures, d.BreakerCooldown, changed),
		checkSlots: slotsFor(o.Pool),
		dest:       d, ledger: ledger{pool: o.Pool, schema: id}, pool: o.Pool, client: o.Client,
		metrics: o.Metrics, log: o.Logger, now: time.Now,
		requests: make(chan struct{}, d.Concurrency),
		// Messages waiting out a backoff hold a worker, not a request slot,
		// so one failing message never idles the destination.
		workers:   make(chan struct{}, 16*d.Concurrency),
		limit:     newLimiter(d.Rate),
		retryWake: make(chan struct{}, 1),
		keys:      make(map[string]chan struct{}),
	}, nil
}

// Write handles a page of messages concurrently and answers for each:
// Applied once the ledger holds its final state (delivered, failed,
// skipped or unknown) or has parked it as retrying (its in-line retries,
// Destination.RetryInline, are used up: Lead sends it from there), Stale
// for a duplicate key or a replay of a message already final or parked,
// Retry (Outage) when the ledger cannot be reached or the relay is
// shutting down. So a failing message holds its page, and the stream,
// for at most RetryInline plus its last attempt.
func (s *Sink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	outs := make([]outbox.Outcome, len(events))
	// Of several messages with one key in a page, the earliest reserves
	// the key: the later ones wait for it and become its duplicates. The
	// earliest also waits for any other Write of this sink that is
	// delivering the key (two Writes of one page at once): read while the
	// other's request is in flight, the ledger row would look like a
	// request a stopped relay left behind, which an idempotent
	// destination sends again.
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
			} else {
				release, ok := s.holdKey(ctx, events[i].SourceID)
				if !ok {
					outs[i] = outage(errShutdown)
					return
				}
				defer release()
			}
			outs[i] = s.deliver(ctx, &events[i])
		}()
	}
	wg.Wait()
	return outs, nil
}

// holdKey waits until no other Write of this sink is delivering key and
// marks it as this one's; release ends that. It reports false if ctx ends
// first.
func (s *Sink) holdKey(ctx context.Context, key string) (release func(), ok bool) {
	for {
		s.keysMu.Lock()
		busy, held := s.keys[key]
		if !held {
			mine := make(chan struct{})
			s.keys[key] = mine
			s.keysMu.Unlock()
			return func() {
				s.keysMu.Lock()
				delete(s.keys, key)
				s.keysMu.Unlock()
				close(mine)
			}, true
		}
		s.keysMu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, false
		}
	}
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
	if problem := poison(e); problem != "" {
		return outbox.Outcome{Status: outbox.Rejected, Reason: fmt.Sprintf("message for destination %s cannot be delivered: %s", name, problem)}
	}
	initial, reason := StateReserved, ""
	if !headerSafe(key) {
		initial, reason = StateFailed, "dedupe_key: contains control characters, which cannot travel in an Idempotency-Key header"
	}
	ent, err := s.ledger.reserve(ctx, name, key, e.ID, e.Document, initial, reason)
	if err != nil {
		return outage(err)
	}
	if ent.eventID != e.ID && ent.conflict {
		s.metrics.count(name, "conflict")
		s.log.Warn("webhook: message has the dedupe key of another with a different payload; not sent", "destination", name,
			"dedupe_key", key, "event_id", e.ID, "holder_event_id", ent.eventID)
		return outbox.Outcome{Status: outbox.Stale, Reason: fmt.Sprintf("conflict: key %q is held by message %d with a different payload", key, ent.eventID)}
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
	return s.send(ctx, e, ent, s.dest.RetryInline)
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

// poison says why an event on the destination's index can never be
// delivered ("" if it can): only append_message's upserts of a JSON
// object under a usable key are messages.
func poison(e *outbox.Event) string {
	switch {
	case e.Op != outbox.OpUpsert:
		return fmt.Sprintf("op %q: a message is an upsert (write it with append_message)", e.Op)
	case e.SourceID == "" || len(e.SourceID) > 512:
		return fmt.Sprintf("dedupe_key: %d bytes, want 1 to 512", len(e.SourceID))
	case len(e.Document) == 0 || !json.Valid(e.Document) || bytes.TrimLeft(e.Document, " \t\r\n")[0] != '{':
		return "payload: not a JSON object"
	}
	return ""
}
