package documents_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/documents"
)

func TestWatch(t *testing.T) {
	t.Parallel()

	t.Run("changes of every contributing table refresh the documents they touch", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.define(t, "tutorials")
		e.watchAll(t, "tutorials")
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'), (2, 'bob')`)
		got, last := e.refreshes(t, 0)
		if want := []string{"tutorials/watch", "tutorials/watch"}; !slices.Equal(got, want) {
			t.Fatalf("inserting authors (a query key, resolved by the relay) refreshed %v, want %v", got, want)
		}
		step := func(what, sql string, want []string) {
			t.Helper()
			e.exec(t, sql)
			var got []string
			got, last = e.refreshes(t, last)
			if !slices.Equal(got, want) {
				t.Errorf("%s: refreshed %v, want %v", what, got, want)
			}
		}
		step("inserting tutorials", `INSERT INTO {s}.tutorials (id, title, author_id) VALUES (10, 'a', 1), (11, 'b', 1), (12, 'c', 2)`, list("tutorials", 10, 11, 12))
		step("updating a tutorial", `UPDATE {s}.tutorials SET title = 'a2' WHERE id = 10`, list("tutorials", 10))
		step("adding a tag", `INSERT INTO {s}.tags VALUES (100, 10, 'go')`, list("tutorials", 10))
		step("editing a tag", `UPDATE {s}.tags SET name = 'golang' WHERE id = 100`, list("tutorials", 10))
		step("moving a tag to another tutorial refreshes the old and the new one", `UPDATE {s}.tags SET tutorial_id = 12 WHERE id = 100`, list("tutorials", 10, 12))
		step("deleting a tag", `DELETE FROM {s}.tags WHERE id = 100`, list("tutorials", 12))
		step("renaming an author leaves its old and new row to the relay", `UPDATE {s}.authors SET name = 'ann2' WHERE id = 1`, []string{"tutorials/watch", "tutorials/watch"})
		step("moving a tutorial to another author", `UPDATE {s}.tutorials SET author_id = 2 WHERE id = 11`, list("tutorials", 11))
		step("deleting a tutorial (and its tags by cascade)", `INSERT INTO {s}.tags VALUES (101, 12, 'x'); DELETE FROM {s}.tutorials WHERE id = 12`, list("tutorials", 12, 12, 12))
	})

	t.Run("a key that cannot work is refused with the reason", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.define(t, "tutorials")
		for _, c := range []struct{ name, table, key, reason string }{
			{"an unknown column", "tags", "tutorial", `no column "tutorial"`},
			{"a key without $1", "tags", "SELECT 1", "does not use $1"},
			{"a key of two columns", "authors", "SELECT t.id, t.title FROM {s}.tutorials t WHERE t.author_id = $1.id", "returns 2 columns"},
			{"a field the row does not have", "tags", "$1.nope", "cannot prepare it"},
			{"an unknown table", "nope", "id", "not a table"},
			{"an empty key", "tags", " ", "key: is empty"},
		} {
			_, err := documents.AddWatch(context.Background(), e.pool, e.schema, documents.WatchOptions{
				Index: "tutorials", Table: e.id + "." + c.table, Key: e.sql(c.key), Operator: "test",
			})
			var de *documents.DefinitionError
			if !errors.As(err, &de) || !strings.Contains(err.Error(), c.reason) {
				t.Errorf("%s: %v; want a *DefinitionError saying %q", c.name, err, c.reason)
			}
		}
		_, err := documents.AddWatch(context.Background(), e.pool, e.schema, documents.WatchOptions{Index: "other", Table: e.id + ".tags", Key: "tutorial_id", Operator: "test"})
		if !errors.Is(err, documents.ErrNotDefined) {
			t.Errorf("watching for an undefined index: %v", err)
		}
	})

	t.Run("a watch can be replaced and removed, and list shows it", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		e.define(t, "tutorials")
		for _, key := range []string{"tutorial_id", "$1.tutorial_id"} {
			if _, err := documents.AddWatch(ctx, e.pool, e.schema, documents.WatchOptions{Index: "tutorials", Table: e.id + ".tags", Key: key, Operator: "test"}); err != nil {
				t.Fatal(err)
			}
		}
		d, err := documents.Get(ctx, e.pool, e.schema, "tutorials")
		if err != nil || len(d.Watches) != 1 || d.Watches[0].Key != "$1.tutorial_id" {
			t.Fatalf("watches: %+v, %v", d, err)
		}
		if err := documents.RemoveWatch(ctx, e.pool, e.schema, "tutorials", e.id+".tags", "test"); err != nil {
			t.Fatal(err)
		}
		e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials VALUES (1, 'a', 1); INSERT INTO {s}.tags VALUES (1, 1, 'x')`)
		if got, _ := e.refreshes(t, 0); len(got) != 0 {
			t.Fatalf("an unwatched table refreshed %v", got)
		}
	})
}
