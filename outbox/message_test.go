package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

func TestAppendMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a message commits with the business transaction as an event on its destination's reserved index", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		var id int64
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			id, err = e.outbox.AppendMessage(ctx, tx, outbox.Message{Destination: "billing", DedupeKey: "order-1-paid", Payload: json.RawMessage(`{"order":1}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		ev := e.stored(t, id)
		if ev.IndexName != ".outboxd-message.billing" || ev.SourceID != "order-1-paid" || ev.Op != outbox.OpUpsert || ev.EventType != "message" {
			t.Fatalf("stored as %+v", ev)
		}
		if d, ok := outbox.MessageDestination(ev.IndexName); !ok || d != "billing" {
			t.Fatalf("MessageDestination(%q) = %q, %t", ev.IndexName, d, ok)
		}
	})

	t.Run("a rolled back transaction leaves no message", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }() // a failure must not leave the schema locked
		if _, err := e.outbox.AppendMessage(ctx, tx, outbox.Message{Destination: "billing", DedupeKey: "k", Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		if n := e.count(t); n != 0 {
			t.Fatalf("%d events after a rollback", n)
		}
	})

	t.Run("a dedupe key of printable ASCII with inner blanks is accepted by Go and SQL", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		key := "order 42/paid: ok~"
		if _, err := e.outbox.AppendMessage(ctx, e.pool, outbox.Message{Destination: "d", DedupeKey: key, Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `SELECT `+e.outbox.Schema()+`.append_message('d', $1, '{}')`, key+"2"); err != nil {
			t.Fatal(err)
		}
	})

	bad := []struct {
		name  string
		m     outbox.Message
		field string
	}{
		{"an empty destination", outbox.Message{DedupeKey: "k", Payload: json.RawMessage(`{}`)}, "destination"},
		{"a destination with capitals", outbox.Message{Destination: "Billing", DedupeKey: "k", Payload: json.RawMessage(`{}`)}, "destination"},
		{"a destination with a dot", outbox.Message{Destination: "a.b", DedupeKey: "k", Payload: json.RawMessage(`{}`)}, "destination"},
		{"an empty dedupe key", outbox.Message{Destination: "d", Payload: json.RawMessage(`{}`)}, "dedupe_key"},
		{"a dedupe key over 512 bytes", outbox.Message{Destination: "d", DedupeKey: strings.Repeat("k", 513), Payload: json.RawMessage(`{}`)}, "dedupe_key"},
		{"a dedupe key with a leading blank", outbox.Message{Destination: "d", DedupeKey: " k", Payload: json.RawMessage(`{}`)}, "dedupe_key"},
		{"a dedupe key with a trailing blank", outbox.Message{Destination: "d", DedupeKey: "k ", Payload: json.RawMessage(`{}`)}, "dedupe_key"},
		{"a dedupe key with a tab", outbox.Message{Destination: "d", DedupeKey: "k\t1", Payload: json.RawMessage(`{}`)}, "dedupe_key"},
		{"a dedupe key with a newline", outbox.Message{Destination: "d", DedupeKey: "k\n1", Payload: json.RawMessage(`{}`)}, "dedupe_key"},
		{"a dedupe key with DEL", outbox.Message{Destination: "d", DedupeKey: "k\x7f", Payload: json.RawMessage(`{}`)}, "dedupe_key"},
		{"a non-ASCII dedupe key", outbox.Message{Destination: "d", DedupeKey: "commande-é", Payload: json.RawMessage(`{}`)}, "dedupe_key"},
		{"a payload that is an array", outbox.Message{Destination: "d", DedupeKey: "k", Payload: json.RawMessage(`[1]`)}, "payload"},
		{"a missing payload", outbox.Message{Destination: "d", DedupeKey: "k"}, "payload"},
	}
	for _, c := range bad {
		t.Run("Go and SQL both refuse "+c.name+", naming the field", func(t *testing.T) {
			t.Parallel()
			e := setupOutbox(t)
			_, err := e.outbox.AppendMessage(ctx, e.pool, c.m)
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || ve.Field != c.field {
				t.Fatalf("Go: want a %s error, got %v", c.field, err)
			}
			var payload any
			if c.m.Payload != nil {
				payload = string(c.m.Payload)
			}
			_, err = e.pool.Exec(ctx, `SELECT `+e.outbox.Schema()+`.append_message($1, $2, $3)`, c.m.Destination, c.m.DedupeKey, payload)
			if err == nil || !strings.Contains(err.Error(), "outboxd: "+c.field+":") {
				t.Fatalf("SQL: want an error naming %s, got %v", c.field, err)
			}
			if n := e.count(t); n != 0 {
				t.Fatalf("%d events written", n)
			}
		})
	}
}
