package relay

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

// deadLetter is an event the relay gave up on, with why.
type deadLetter struct {
	event    outbox.Event
	reason   string
	attempts int
	first    time.Time
	last     time.Time
}

func parkDeadLetters(ctx context.Context, tx pgx.Tx, schemaName, stream string, dead []deadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	rows := make([][]any, len(dead))
	for i, d := range dead {
		e := d.event
		rows[i] = []any{e.ID, stream, e.IndexName, e.SourceID, e.Version, string(e.Op), nullable(e.Document),
			nullString(e.EventType), nullable(e.Headers), e.OccurredAt, d.reason, d.attempts, d.first, d.last}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{schemaName, "dead_letters"},
		[]string{"event_id", "stream", "index_name", "source_id", "version", "op", "document", "event_type", "headers",
			"occurred_at", "reason", "attempts", "first_failed_at", "last_failed_at"},
		pgx.CopyFromRows(rows))
	return err
}

func nullable(b json.RawMessage) any {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	return []byte(b)
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
