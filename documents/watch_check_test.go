package documents_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/documents"
)

// Keys that prepare with $1 the row but that the trigger's $1 rewrite
// (watch_key_rows) breaks: an E-string's \' pairs the wrong quotes, and a
// quote in a comment does too, so a $1 outside any string is left as $1.
var keysTheRewriteBreaks = []struct{ name, key, reason string }{
	{"an E-string with \\' and $1", `E'\'' || $1.tutorial_id || '-'`, "E'"},
	{"a comment", `$1.tutorial_id::text /* it's */ || ($1).name || ''`, "comment"},
}

func TestWatchRefusesAKeyTheTriggerCannotRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.define(t, "tutorials")
	e.exec(t, `INSERT INTO {s}.authors VALUES (1, 'ann'); INSERT INTO {s}.tutorials (id, title, author_id) VALUES (10, 'a', 1)`)
	refused := func(t *testing.T, key, reason string) {
		t.Helper()
		_, err := documents.AddWatch(ctx, e.pool, e.schema, documents.WatchOptions{Index: "tutorials", Table: e.id + ".tags", Key: key, Operator: "test"})
		var de *documents.DefinitionError
		if !errors.As(err, &de) || !strings.Contains(err.Error(), "key: ") || !strings.Contains(err.Error(), reason) {
			t.Errorf("watching with key %s: %v; want a *DefinitionError naming key and saying %q", key, err, reason)
		}
		if got := e.triggersOf(t, "{s}.tags"); len(got) != 0 {
			t.Errorf("a refused watch installed %v", got)
		}
		d, err := documents.Get(ctx, e.pool, e.schema, "tutorials")
		if err != nil || len(d.Watches) != 0 {
			t.Errorf("a refused watch is listed: %+v, %v", d, err)
		}
		e.exec(t, `INSERT INTO {s}.tags VALUES (100, 10, 'go'); DELETE FROM {s}.tags`)
	}
	for _, c := range keysTheRewriteBreaks {
		t.Run(c.name+" is refused by its form", func(t *testing.T) { refused(t, c.key, c.reason) })
	}
	t.Run("the same text inside a string is not refused", func(t *testing.T) {
		if _, err := documents.AddWatch(ctx, e.pool, e.schema, documents.WatchOptions{Index: "tutorials", Table: e.id + ".tags", Key: `$1.tutorial_id::text || 'E''--/*$$'`, Operator: "test"}); err != nil {
			t.Fatal(err)
		}
		if err := documents.RemoveWatch(ctx, e.pool, e.schema, "tutorials", e.id+".tags", "test"); err != nil {
			t.Fatal(err)
		}
	})
	// Without the rule on the key's form, running the trigger's statement
	// at watch time refuses the same keys with PostgreSQL's message.
	t.Run("the trigger's statement is run at watch time", func(t *testing.T) {
		defer documents.SkipKeyFormRule()()
		for _, c := range keysTheRewriteBreaks {
			refused(t, c.key, "there is no parameter $1")
		}
	})
}
