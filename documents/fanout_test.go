package documents_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

// outboxEvents reads the refresh events after id after, as the relay does.
func (e *env) outboxEvents(t testing.TB, after int64) ([]outbox.Event, int64) {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), e.sql(`SELECT id, index_name, source_id, version, op, coalesce(event_type, ''), headers
		FROM {s}.events WHERE id > $1 ORDER BY id`), after)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Event, error) {
		var ev outbox.Event
		var h []byte
		err := r.Scan(&ev.ID, &ev.IndexName, &ev.SourceID, &ev.Version, (*string)(&ev.Op), &ev.EventType, &h)
		ev.Headers = json.RawMessage(h)
		return ev, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > 0 {
		after = out[len(out)-1].ID
	}
	return out, after
}

func TestFanout(t *testing.T) {
	t.Parallel()

	t.Run("an author renamed while a tutorial moves to it ends in the tutorial's document", func(t *testing.T) {
		t.Parallel()
		e, x := setup(t), esSetup(t)
		e.define(t, x.name)
		e.watchAll(t, x.name)
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'), (2, 'bob'); INSERT INTO {s}.tutorials (id, title, author_id) VALUES (10, 'a', 1)`)
		s := docSink(t, e, x, nil)
		ctx := context.Background()
		write := func(after int64) int64 {
			t.Helper()
			evs, last := e.outboxEvents(t, after)
			out, err := s.Write(ctx, evs)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range out {
				if o.Status != outbox.Applied && o.Status != outbox.Stale {
					t.Fatalf("event %d %+v: %+v", i, evs[i], o)
				}
			}
			return last
		}
		last := write(0)

		rename, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer rename.Rollback(ctx)
		move, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer move.Rollback(ctx)
		if _, err := move.Exec(ctx, e.sql(`UPDATE {s}.tutorials SET author_id = 2 WHERE id = 10`)); err != nil {
			t.Fatal(err)
		}
		// The rename's trigger runs while the move is not committed: a
		// key query run here could not see tutorial 10 under author 2.
		if _, err := rename.Exec(ctx, e.sql(`UPDATE {s}.authors SET name = 'bob2' WHERE id = 2`)); err != nil {
			t.Fatal(err)
		}
		if err := move.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		last = write(last) // reads tutorial 10 before the rename commits: author bob
		if err := rename.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		write(last)
		docs, visible := x.state(t)
		if d := compare(t, e.expected(t, x.name, `SELECT id FROM {s}.tutorials`), docs, visible); !d.zero() {
			t.Fatalf("%v: stored %s", d, docs["10"].Source)
		}
	})
}
