package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

// The index keeps outboxd_deleted and outboxd_deleted_at for tombstones: a
// user document carrying one at its top level would be hidden and purged.
func TestOutboxRefusesReservedFields(t *testing.T) {
	t.Parallel()
	reserved := func(source string) outbox.Event {
		ev := upsert(source, 1)
		ev.Document = json.RawMessage(`{"title": "x", "outboxd_deleted": true}`)
		return ev
	}

	t.Run("Queue and AppendBatch refuse the event naming the field", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := context.Background()
		_, err := e.outbox.AppendBatch(ctx, e.pool, []outbox.Event{upsert("ok", 1), reserved("bad")})
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != "document" || !strings.Contains(err.Error(), "outboxd_deleted") {
			t.Fatalf("AppendBatch: %v, want a ValidationError naming document and outboxd_deleted", err)
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("%d events written", n)
		}
	})

	t.Run("a nested field of that name is the user's own", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ev := upsert("nested", 1)
		ev.Document = json.RawMessage(`{"meta": {"outboxd_deleted": true}}`)
		if _, err := e.outbox.Append(context.Background(), e.pool, ev); err != nil {
			t.Fatalf("Append: %v", err)
		}
	})

	t.Run("the SQL append function and the capture trigger refuse it, naming the field", func(t *testing.T) {
		t.Parallel()
		e := setupOutbox(t)
		ctx := context.Background()
		s := e.outbox.Schema()
		_, err := e.pool.Exec(ctx, `SELECT `+s+`.append('tutorials', 'a', 1, 'upsert', '{"outboxd_deleted": true}')`)
		if err == nil || !strings.Contains(err.Error(), "outboxd_deleted") || !strings.Contains(err.Error(), "reserved") {
			t.Fatalf("append: %v, want refused naming the reserved field", err)
		}
		if _, err := e.pool.Exec(ctx, `CREATE TABLE `+s+`.notes (id int PRIMARY KEY, outboxd_deleted_at text);
			SELECT `+s+`.capture('`+s+`.notes', 'notes', 'id')`); err != nil {
			t.Fatal(err)
		}
		_, err = e.pool.Exec(ctx, `INSERT INTO `+s+`.notes VALUES (1, 'x')`)
		if err == nil || !strings.Contains(err.Error(), "outboxd_deleted_at") || !strings.Contains(err.Error(), "reserved") {
			t.Fatalf("captured insert: %v, want refused naming the reserved field", err)
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("%d events written", n)
		}
	})
}

// ReservedField finds the reserved fields however the document places
// them, and passes what merely looks like them.
func TestReservedField(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]string{
		`{"outboxd_deleted":true}`:                        "outboxd_deleted",
		`{"a":"x","outboxd_deleted_at":"2026-12-05"}`:     "outboxd_deleted_at",
		`{"xx":"xoutboxd","x":1,"outboxd_deleted":1}`:     "outboxd_deleted",
		`{"outboxd_\u0064eleted":true}`:                   "outboxd_deleted",
		`{"box":"x x x outboxd outboxd_delete","n":"\n"}`: "",
		`{"meta":{"outboxd_deleted":true}}`:               "",
		`{"body":"lorem ipsum dolor sit amet"}`:           "",
		`{"é":"\u00e9"}`:                                  "",
	} {
		if got := outbox.ReservedField(json.RawMessage(doc)); got != want {
			t.Errorf("ReservedField(%s) = %q, want %q", doc, got, want)
		}
	}
}
