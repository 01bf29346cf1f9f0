package webhook

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema"
)

// UnroutedSink takes the messages for destinations this relay does not
// know: each is recorded in the ledger as failed with the reason, never
// sent. Give it a stream over all of outbox.MessagePrefix+"*": messages
// for the configured destinations are left to their own streams (Stale
// here). Its filter thus never changes when destinations are added or
// removed. Once the destination is configured, an operator sends such a
// message with outboxd deliveries resolve --retry.
type UnroutedSink struct {
	ledger     ledger
	configured map[string]bool
	metrics    *Metrics
}

// NewUnroutedSink returns the sink for messages whose destination is not
// among configured.
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

func (u *UnroutedSink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	outs := make([]outbox.Outcome, len(events))
	for i, e := range events {
		dest, ok := outbox.MessageDestination(e.IndexName)
		if !ok {
			outs[i] = outbox.Outcome{Status: outbox.Rejected, Reason: fmt.Sprintf("index %q is not a message: check the stream's index filter", e.IndexName)}
			continue
		}
		if u.configured[dest] {
			outs[i] = outbox.Outcome{Status: outbox.Stale, Reason: "delivered by the destination's own stream"}
			continue
		}
		ent, err := u.ledger.reserve(ctx, dest, e.SourceID, e.ID, e.Document, StateFailed,
			fmt.Sprintf("destination %q is not configured on the relay (--destination %s=URL,...)", dest, dest))
		if err != nil {
			return nil, err
		}
		switch {
		case ent.eventID != e.ID:
			u.metrics.count(dest, "duplicate")
			outs[i] = outbox.Outcome{Status: outbox.Stale, Reason: fmt.Sprintf("duplicate of message %d", ent.eventID)}
		default:
			u.metrics.count(dest, ent.state)
			outs[i] = applied
		}
	}
	return outs, nil
}
