package indexer

import (
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

func TestSinkRejectsReservedFields(t *testing.T) {
	t.Parallel()

	t.Run("the outbox reserves exactly the tombstone fields", func(t *testing.T) {
		t.Parallel()
		if want := []string{TombstoneField, TombstoneAtField}; !slices.Equal(outbox.ReservedFields, want) {
			t.Fatalf("outbox.ReservedFields = %v, want %v", outbox.ReservedFields, want)
		}
	})

	t.Run("an event whose document carries a reserved field is rejected with the reason, not written", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		s := newSink(t, Options{Client: es})
		out := mustWrite(t, s, upsert(name, "ok", 1, `{"a":1}`), upsert(name, "bad", 1, `{"a":1,"outboxd_deleted":true}`))
		if out[0].Status != outbox.Applied {
			t.Fatalf("the other event: %+v, want applied", out[0])
		}
		if out[1].Status != outbox.Rejected || !strings.Contains(out[1].Reason, "outboxd_deleted") || !strings.Contains(out[1].Reason, "reserved") {
			t.Fatalf("got %+v, want rejected naming the reserved field", out[1])
		}
		if d := getDoc(t, es, WriteAlias(name), "bad"); d.Found {
			t.Fatalf("the document was written: %s", d.Source)
		}
	})
}
