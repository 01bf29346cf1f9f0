package webhook

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// UnroutedSink sees every message (give it a stream over all of
// outbox.MessagePrefix+"*", on every relay, with or without destinations)
// and makes sure each one has a ledger row however the relays are
// configured: a message whose destination no live relay serves is
// recorded as waiting, never failed and never sent here; the
// destination's own sink takes it over once a relay serves it. A message
// of a served destination is recorded as waiting too, unless its own
// stream got there first, so that no message is ever without a row.
// Its filter thus never changes when destinations are added or removed.
type UnroutedSink struct {
	ledger     ledger
	configured map[string]bool
	served     ServedFunc
	metrics    *Metrics
}

// ServedFunc reports which of the given destinations a live relay serves
// in a way that keeps their messages until its sink has recorded them
// (outboxd relay: the destination's stream is registered and advertised by
// a live relay).
type ServedFunc func(ctx context.Context, destinations []string) (map[string]bool, error)

// NewUnroutedSink returns the sink for messages whose destination is not
// served. Without SetServed, the destinations in configured count as
// served and every other as unserved.
func NewUnroutedSink(pool *pgxpool.Pool, schemaName string, configured []string, m *Metrics) (*UnroutedSink, error) {
	if pool == nil {
		return nil, errors.New("webhook: unrouted sink: Pool is required")
	}
	if schemaName == "" {
		schemaName = schema.DefaultName
	}
	id, err := schema.Ident(schemaName)
	if err != nil {
		return nil, err
	}
	u := &UnroutedSink{ledger: ledger{pool: pool, schema: id}, configured: map[string]bool{}, metrics: m}
	for _, c := range configured {
		u.configured[c] = true
	}
	return u, nil
}

// SetServed makes f decide which destinations are served, for relays
// whose fleet may serve destinations this one does not.
func (u *UnroutedSink) SetServed(f ServedFunc) { u.served = f }

// passThrough is the outcome of a message its destination's stream records.
var passThrough = outbox.Outcome{Status: outbox.Stale, Reason: "recorded by the destination's own stream"}

func (u *UnroutedSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	outs := make([]outbox.Outcome, len(events))
	served, err := u.servedOf(ctx, events)
	if err != nil {
		return nil, err
	}
	for i, e := range events {
		dest, ok := outbox.MessageDestination(e.IndexName)
		if !ok {
			outs[i] = outbox.Outcome{Status: outbox.Rejected, Reason: fmt.Sprintf("index %q is not a message: check the stream's index filter", e.IndexName)}
			continue
		}
		// A served destination's message is recorded too: its stream may
		// not have read it yet, and a stream dropped or a destination
		// removed before it does would otherwise leave the message with
		// no trace once retention deletes it. The destination's sink takes
		// a waiting row over when it reads the message; a row it already
		// has is left as it is.
		reason := fmt.Sprintf("no live relay serves destination %q (--destination %s=URL,...): waiting for one", dest, dest)
		if served[dest] {
			reason = fmt.Sprintf("waiting for destination %q's stream to read it", dest)
		}
		ent, err := u.ledger.reserve(ctx, dest, e.SourceID, e.ID, e.Document, StateWaiting, reason)
		if err != nil {
			return nil, err
		}
		if !served[dest] && ent.eventID == e.ID && ent.state == StateWaiting {
			u.metrics.count(dest, StateWaiting)
		}
		// Recorded (as waiting, as a duplicate, or already by its own
		// stream): the destination's sink delivers it when one runs.
		outs[i] = passThrough
	}
	return outs, nil
}

// servedOf asks once per page which of its destinations are served.
func (u *UnroutedSink) servedOf(ctx context.Context, events []outbox.Event) (map[string]bool, error) {
	if u.served == nil {
		return u.configured, nil
	}
	seen := map[string]bool{}
	var dests []string
	for _, e := range events {
		if d, ok := outbox.MessageDestination(e.IndexName); ok && !seen[d] {
			seen[d] = true
			dests = append(dests, d)
		}
	}
	if len(dests) == 0 {
		return nil, nil
	}
	served, err := u.served(ctx, dests)
	if err != nil {
		return nil, fmt.Errorf("webhook: unrouted: which destinations are served: %w", err)
	}
	return served, nil
}
