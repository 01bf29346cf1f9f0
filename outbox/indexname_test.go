package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

func TestIndexNameRulesAgree(t *testing.T) {
	t.Parallel()
	e := setupOutbox(t)
	names := []struct {
		name string
		ok   bool
	}{
		{"tutorials", true},
		{"a-b_c.d+e", true},
		{"x.", true},
		{"ünïcode", true},
		{"read", true},
		{"x-reader", true},
		{"x-read.v2", true},
		{"x-00001", true},
		{"x-0000001", true},
		{"x-writes", true},
		{strings.Repeat("i", outbox.MaxIndexNameBytes), true},
		{"x-read", false},
		{"x-write", false},
		{"x-000001", false},
		{"x-999999", false},
		{"-read", false},
		{strings.Repeat("i", outbox.MaxIndexNameBytes+1), false},
		{strings.Repeat("i", 256), false},
		{"Ünicode", false},
		{"ünicodÉ", false},
		{"Tutorials", false},
		{"a:b", false},
		{"a b", false},
		{`a\b`, false},
		{"a#b", false},
		{"_x", false},
		{"-x", false},
		{"+x", false},
		{".x", false},
		{".", false},
		{"..", false},
		{"", false},
	}

	t.Run("Go, the SQL append and a direct INSERT accept and refuse the same names", func(t *testing.T) {
		t.Parallel()
		for _, n := range names {
			ctx := t.Context()
			goErr := outbox.ValidateIndexName(n.name)
			var ve *outbox.ValidationError
			if (goErr == nil) != n.ok || (goErr != nil && (!errors.As(goErr, &ve) || ve.Field != "index_name")) {
				t.Errorf("Go %q: %v, want ok=%v or an index_name error", n.name, goErr, n.ok)
			}
			_, sqlErr := e.pool.Exec(ctx, `SELECT `+e.outbox.Schema()+`.append($1, 's', 1, 'delete', NULL)`, n.name)
			if (sqlErr == nil) != n.ok || (sqlErr != nil && !strings.Contains(sqlErr.Error(), "index_name:")) {
				t.Errorf("SQL append %q: %v, want ok=%v or an index_name error", n.name, sqlErr, n.ok)
			}
			_, insErr := e.pool.Exec(ctx, `INSERT INTO `+e.outbox.Schema()+`.events (index_name, source_id, version, op) VALUES ($1, 's', 1, 'delete')`, n.name)
			if (insErr == nil) != n.ok || (insErr != nil && !strings.Contains(insErr.Error(), "index_name:")) {
				t.Errorf("INSERT %q: %v, want ok=%v or an index_name error", n.name, insErr, n.ok)
			}
			if goErr != nil && sqlErr != nil && insErr != nil {
				// Same rule, same words: only the quoting of the error differs.
				if want := strings.TrimPrefix(goErr.Error(), "outboxd: "); !strings.Contains(sqlErr.Error(), want) || !strings.Contains(insErr.Error(), want) {
					t.Errorf("%q: SQL append says %q, INSERT %q, Go %q", n.name, sqlErr, insErr, want)
				}
			}
		}
	})

	t.Run("a reserved name's error says which index's names it collides with", func(t *testing.T) {
		err := outbox.ValidateIndexName("tutorials-read")
		if err == nil || !strings.Contains(err.Error(), `ends in -read`) || !strings.Contains(err.Error(), `index "tutorials"`) {
			t.Fatalf("got %v", err)
		}
	})
}
