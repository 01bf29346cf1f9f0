package relay

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// TestRowDecoder reads real rows both ways: the decoder must give what
// pgx's scan gives, field for field, and leave to the scan what it cannot
// hold.
func TestRowDecoder(t *testing.T) {
	ctx := context.Background()
	pool, name := schematest.Setup(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+name+`.events (index_name, source_id, version, op, document, event_type, headers, occurred_at)
VALUES ('items', 'a', 1, 'upsert', '{"b": [1, 2.5, "x"], "a": null}', 'created', '{"h": "v"}', '2026-12-05 10:11:12.345678+00'),
       ('items', 'ü-ß/€ 2', 9223372036854775807, 'delete', NULL, NULL, NULL, '1960-02-29 23:59:59.999999+00'),
       ('other', 'c', 3, 'upsert', '{}', 'created', '{}', '0001-01-01 00:00:00+00'),
       ('items', 'big', 5, 'upsert', jsonb_build_object('body', repeat('x', 5000)), 'created', NULL, '294276-12-31 23:59:59.999999+00'),
       ('items', 'd', 4, 'upsert', '{"d": 1}', NULL, NULL, 'infinity')`)
	if err != nil {
		t.Fatal(err)
	}
	read := func(fast bool) ([]outbox.Event, []bool) {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT `+eventColumns+` FROM `+name+`.events ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		dec := newRowDecoder(rows.FieldDescriptions(), rows.Conn().TypeMap())
		if !dec.ok {
			t.Fatalf("the page query's columns are not the ones the decoder expects: %v", rows.FieldDescriptions())
		}
		var events []outbox.Event
		var decoded []bool
		for rows.Next() {
			var e outbox.Event
			ok := fast && dec.decode(rows.RawValues(), &e)
			if !ok {
				if err := rows.Scan(&e.ID, &e.XID, &e.IndexName, &e.SourceID, &e.Version, (*string)(&e.Op), (*[]byte)(&e.Document),
					&e.EventType, (*[]byte)(&e.Headers), &e.OccurredAt, &e.CreatedAt); err != nil {
					// pgx cannot put infinity in a time.Time either (and
					// ends the rows: the last row is the infinite one).
					return append(events, outbox.Event{ID: -1}), append(decoded, false)
				}
			}
			events = append(events, e)
			decoded = append(decoded, ok)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return events, decoded
	}
	got, decoded := read(true)
	want, _ := read(false)
	if len(got) != 5 || len(want) != 5 {
		t.Fatalf("read %d and %d rows, want 5", len(got), len(want))
	}
	for i := range 4 {
		if !decoded[i] {
			t.Errorf("row %d: decoded by scan, not by the decoder", i)
		}
		g, w := got[i], want[i]
		if g.ID != w.ID || g.XID != w.XID || g.IndexName != w.IndexName || g.SourceID != w.SourceID || g.Version != w.Version ||
			g.Op != w.Op || g.EventType != w.EventType {
			t.Errorf("row %d: decoded %+v, scanned %+v", i, g, w)
		}
		if !bytes.Equal(g.Document, w.Document) || (g.Document == nil) != (w.Document == nil) ||
			!bytes.Equal(g.Headers, w.Headers) || (g.Headers == nil) != (w.Headers == nil) {
			t.Errorf("row %d: document %q headers %q, scanned %q and %q", i, g.Document, g.Headers, w.Document, w.Headers)
		}
		if !g.OccurredAt.Equal(w.OccurredAt) || !g.CreatedAt.Equal(w.CreatedAt) ||
			g.OccurredAt.Location().String() != w.OccurredAt.Location().String() {
			t.Errorf("row %d: times %v %v, scanned %v %v", i, g.OccurredAt, g.CreatedAt, w.OccurredAt, w.CreatedAt)
		}
	}
	if decoded[4] || got[4].ID != want[4].ID {
		t.Errorf("an infinite timestamp: decoded %v (%+v), want it left to the scan (%+v)", decoded[4], got[4], want[4])
	}
	t.Run("a pool with codecs of its own is left to the scan", func(t *testing.T) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		defer conn.Conn().Close(ctx) // its type map is not the pool's any more
		conn.Conn().TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID, Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC}})
		rows, err := conn.Query(ctx, `SELECT `+eventColumns+` FROM `+name+`.events LIMIT 1`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		if newRowDecoder(rows.FieldDescriptions(), rows.Conn().TypeMap()).ok {
			t.Fatal("the decoder would ignore the connection's timestamptz codec")
		}
	})
	// An append to one event's bytes must not reach the next's.
	_ = append(got[0].Document, "garbage"...)
	if !bytes.Equal(got[0].Headers, want[0].Headers) {
		t.Errorf("appending to a document changed the headers after it: %q", got[0].Headers)
	}
}

// The buffers a page's documents are copied into hold little more than
// the documents: what the byte caps count is what the page costs.
func TestRowDecoderBuffers(t *testing.T) {
	t.Run("a small page holds a small buffer", func(t *testing.T) {
		var d rowDecoder
		d.copyBytes(make([]byte, 200))
		if cap(d.buf) > sharedMin {
			t.Fatalf("one 200-byte document took a %d-byte buffer", cap(d.buf))
		}
	})
	for _, sizes := range [][]int{{100}, {1000}, {4096}, {100, 4096}, {4097}, {32769}, {100, 65437}, {40000}, {3000, 5000, 200}} {
		t.Run(fmt.Sprint("documents of ", sizes, " bytes"), func(t *testing.T) {
			var d rowDecoder
			held, used := 0, 0
			for i := 0; used < 4<<20; i++ {
				b := make([]byte, sizes[i%len(sizes)])
				before := unsafe.SliceData(d.buf)
				out := d.copyBytes(b)
				used += len(b)
				switch {
				case len(b) > ownAbove:
					held += cap(out)
				case unsafe.SliceData(d.buf) != before:
					held += cap(d.buf)
				}
			}
			if limit := used + used/16 + sharedMax; held > limit {
				t.Fatalf("%d bytes of documents held %d bytes of buffers, more than %d", used, held, limit)
			}
		})
	}
}
