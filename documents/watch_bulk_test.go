package documents_test

import (
	"os"
	"testing"
	"time"
)

// TestWatchBulkTiming prints how long a 20k-row UPDATE of each kind of
// watched table takes to commit (a measurement, not a check: set
// OUTBOXD_WATCH_BULK=1 to run it; docs/benchmarks.md quotes it).
func TestWatchBulkTiming(t *testing.T) {
	if os.Getenv("OUTBOXD_WATCH_BULK") == "" {
		t.Skip("a measurement: set OUTBOXD_WATCH_BULK=1")
	}
	e := setup(t)
	e.define(t, "tutorials")
	e.exec(t, `INSERT INTO {s}.authors SELECT g, 'a' || g FROM generate_series(1, 20000) g;
		INSERT INTO {s}.tutorials (id, title, author_id) SELECT g, 't' || g, g FROM generate_series(1, 20000) g;
		INSERT INTO {s}.tags SELECT g, g, 'x' FROM generate_series(1, 20000) g;
		ANALYZE {s}.authors; ANALYZE {s}.tutorials; ANALYZE {s}.tags`)
	timed := func(what, sql string) {
		start := time.Now()
		e.exec(t, sql)
		t.Logf("%-40s %v", what, time.Since(start).Round(time.Millisecond))
	}
	timed("unwatched UPDATE tutorials (20k)", `UPDATE {s}.tutorials SET bump = bump + 1`)
	e.watchAll(t, "tutorials")
	timed("column key: UPDATE tutorials (20k)", `UPDATE {s}.tutorials SET bump = bump + 1`)
	timed("expression key: UPDATE tags (20k)", `UPDATE {s}.tags SET name = name || 'y'`)
	timed("query key: UPDATE authors (20k)", `UPDATE {s}.authors SET name = name || 'y'`)
	timed("column key: no-op UPDATE tutorials (20k)", `UPDATE {s}.tutorials SET bump = bump`)
}
