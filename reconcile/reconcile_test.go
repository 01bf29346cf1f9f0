package reconcile

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/estest"
	"github.com/outboxd/outboxd/internal/tooltest"
	"github.com/outboxd/outboxd/schema/schematest"
)

// seedReconcile writes one source table and one index family that
// disagree in every way reconcile reports.
//
//	ok     source v2, index v2                     no drift
//	miss   source v1, not in the index             missing: upsert at 1
//	stale  source v5, index v3                     stale: upsert at 5
//	extra  no source row, index v4                 extra: delete at 5
//	resur  deleted in the source at v6, index v3   resurrected: delete at 6
//	tomb   deleted in the source at v2, tombstone  no drift
//	dup    source v2, index v2 plus a random copy  duplicate (needs repair)
//	buried source v3, tombstone at v4              missing: upsert at 4
//	ahead  source v1, index v2, other content      ahead: upsert at 3
//	same   source v1, index v2, same content       no drift
func seedReconcile(t *testing.T, pool *pgxpool.Pool, schemaName string, ri *tooltest.Family) string {
	t.Helper()
	ctx := context.Background()
	table := `"` + schemaName + `".articles`
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY, version bigint NOT NULL, doc jsonb, deleted boolean NOT NULL DEFAULT false);
		INSERT INTO `+table+` VALUES
		('ok', 2, '{"title":"ok"}', false),
		('miss', 1, '{"title":"miss"}', false),
		('stale', 5, '{"title":"stale v5"}', false),
		('resur', 6, NULL, false),
		('tomb', 2, '{"title":"old"}', true),
		('dup', 2, '{"title":"dup"}', false),
		('buried', 3, '{"title":"buried"}', false),
		('ahead', 1, '{"title":"ahead v1"}', false),
		('same', 1, '{"title":"same"}', false)`)
	if err != nil {
		t.Fatal(err)
	}
	w := ri.Write
	ri.Put(t, w, "ok", 2, `{"title":"ok"}`)
	ri.Put(t, w, "stale", 3, `{"title":"stale v3"}`)
	ri.Put(t, w, "extra", 4, `{"title":"extra"}`)
	ri.Put(t, w, "resur", 3, `{"title":"resur"}`)
	ri.Put(t, w, "tomb", 2, estest.Tombstone)
	ri.Put(t, w, "dup", 2, `{"title":"dup"}`)
	ri.Put(t, w, "legacy-dup", 0, `{"source_id":"dup","title":"dup"}`)
	ri.Put(t, w, "buried", 4, estest.Tombstone)
	ri.Put(t, w, "ahead", 2, `{"title":"ahead v2"}`)
	ri.Put(t, w, "same", 2, `{"title":"same"}`)
	ri.Refresh(t)
	return `SELECT id, version, doc, deleted FROM ` + table
}

func TestReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setup := func(t *testing.T) (*pgxpool.Pool, string, *tooltest.Family, string) {
		pool, schemaName := schematest.Setup(t)
		ri := tooltest.NewFamily(t, false)
		return pool, schemaName, ri, seedReconcile(t, pool, schemaName, ri)
	}
	wantCounts := map[string]int64{DriftMissing: 2, DriftStale: 1, DriftExtra: 1, DriftResurrected: 1, DriftDuplicate: 1, DriftAhead: 1}

	t.Run("a dry run detects each kind of drift and appends nothing", func(t *testing.T) {
		t.Parallel()
		pool, schemaName, ri, sql := setup(t)
		rep, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name, SourceSQL: sql, Sample: 5})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(rep.Counts, wantCounts) {
			t.Fatalf("counts %v, want %v", rep.Counts, wantCounts)
		}
		if rep.Events != 6 || rep.IndexDocs != 10 || rep.SourceRows != 9 || !rep.Drifted() {
			t.Fatalf("report %+v", rep)
		}
		if s := rep.Samples[DriftDuplicate]; len(s) != 1 || s[0].SourceID != "dup" || !strings.Contains(s[0].Fix, "repair") {
			t.Fatalf("duplicate samples %+v", s)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schemaName+`".events`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("a dry run appended %d events (%v)", n, err)
		}
	})

	t.Run("apply appends versioned fixes that win the version gate", func(t *testing.T) {
		t.Parallel()
		pool, schemaName, ri, sql := setup(t)
		rep, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name, SourceSQL: sql, Apply: true, Operator: "tester"})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Applied || rep.Events != 6 {
			t.Fatalf("report %+v", rep)
		}
		rows, err := pool.Query(ctx, `SELECT index_name, source_id, version, op, coalesce(document->>'title', '') FROM "`+schemaName+`".events ORDER BY source_id`)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for rows.Next() {
			var idx, sid, op, title string
			var v int64
			if err := rows.Scan(&idx, &sid, &v, &op, &title); err != nil {
				t.Fatal(err)
			}
			if idx != ri.Name {
				t.Errorf("event for %s has index_name %q, want the write alias %q", sid, idx, ri.Name)
			}
			got = append(got, strings.Join([]string{sid, op, title, reconItoa(v)}, " "))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		want := []string{"ahead upsert ahead v1 3", "buried upsert buried 4", "extra delete  5", "miss upsert miss 1", "resur delete  6", "stale upsert stale v5 5"}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("events\n got %q\nwant %q", got, want)
		}
		var counter int64
		if err := pool.QueryRow(ctx, `SELECT version FROM "`+schemaName+`".versions WHERE index_name = $1 AND source_id = 'extra'`, ri.Name).Scan(&counter); err != nil || counter != 5 {
			t.Fatalf("versions counter for extra = %d (%v), want 5 so later auto versions win", counter, err)
		}
		var audits int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schemaName+`".audit_log WHERE action = 'reconcile.apply' AND operator = 'tester'`).Scan(&audits); err != nil || audits != 1 {
			t.Fatalf("audit rows %d (%v)", audits, err)
		}

		// Deliver the fixes as the sink would (external_gte at the event's
		// version), then reconcile again: only what an event cannot fix
		// remains.
		rows, err = pool.Query(ctx, `SELECT source_id, version, op, document FROM "`+schemaName+`".events ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var sid, op string
			var v int64
			var doc []byte
			if err := rows.Scan(&sid, &v, &op, &doc); err != nil {
				t.Fatal(err)
			}
			if op == "delete" {
				doc = []byte(estest.Tombstone)
			}
			if status, _ := estest.Call(t, ri.ES, "PUT", "/"+ri.Name+"/_doc/"+sid+"?version="+reconItoa(v)+"&version_type=external_gte", string(doc)); status >= 300 {
				t.Errorf("fix for %s at version %d lost the version gate: status %d", sid, v, status)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		ri.Refresh(t)
		again, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name, SourceSQL: sql})
		if err != nil {
			t.Fatal(err)
		}
		// "buried" and "ahead" are now at versions above the source's (the
		// fixes had to pass what the index held) with the source's
		// content: not drift.
		left := map[string]int64{DriftMissing: 0, DriftStale: 0, DriftExtra: 0, DriftResurrected: 0, DriftDuplicate: 1, DriftAhead: 0}
		if !reflect.DeepEqual(again.Counts, left) {
			t.Fatalf("after delivering the fixes: counts %v, want %v", again.Counts, left)
		}
	})

	// deliver writes the outbox's events as the sink would: external_gte at
	// the event's version, a tombstone for a delete.
	deliver := func(t *testing.T, pool *pgxpool.Pool, schemaName string, ri *tooltest.Family) {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT source_id, version, op, document FROM "`+schemaName+`".events ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var sid, op string
			var v int64
			var doc []byte
			if err := rows.Scan(&sid, &v, &op, &doc); err != nil {
				t.Fatal(err)
			}
			if op == "delete" {
				doc = []byte(estest.Tombstone)
			}
			ri.Put(t, ri.Write, sid, v, string(doc))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		ri.Refresh(t)
	}

	t.Run("a document's own version field is data: it reconciles clean and a second apply appends nothing", func(t *testing.T) {
		t.Parallel()
		pool, schemaName := schematest.Setup(t)
		ri := tooltest.NewFamily(t, false)
		table := `"` + schemaName + `".apps`
		// "version" in the body is the app's release, not the row's version.
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text, version bigint, doc jsonb);
			INSERT INTO `+table+` VALUES ('app', 3, '{"name":"app","version":1}'), ('new', 1, '{"name":"new","version":9}')`); err != nil {
			t.Fatal(err)
		}
		ri.Put(t, ri.Write, "app", 3, `{"name":"app","version":1}`)
		ri.Refresh(t)
		sql := `SELECT id, version, doc FROM ` + table
		opts := Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name, SourceSQL: sql, Apply: true}
		rep, err := Run(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{DriftMissing: 1, DriftStale: 0, DriftExtra: 0, DriftResurrected: 0, DriftDuplicate: 0, DriftAhead: 0}
		if !reflect.DeepEqual(rep.Counts, want) || rep.Events != 1 {
			t.Fatalf("first run: counts %v, %d events; want only the missing document", rep.Counts, rep.Events)
		}
		deliver(t, pool, schemaName, ri)
		again, err := Run(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if again.Drifted() || again.Events != 0 {
			t.Fatalf("second run: counts %v, %d events appended; want none", again.Counts, again.Events)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schemaName+`".events`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d events in the outbox (%v), want the one fix", n, err)
		}
	})

	t.Run("a version field compares a legacy index by the document's field", func(t *testing.T) {
		t.Parallel()
		pool, schemaName := schematest.Setup(t)
		ri := tooltest.NewFamily(t, false)
		table := `"` + schemaName + `".legacy`
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text, version bigint, doc jsonb);
			INSERT INTO `+table+` VALUES ('same', 5, '{"rev":5}'), ('behind', 7, '{"rev":7}')`); err != nil {
			t.Fatal(err)
		}
		// A legacy writer: internal versioning, so _version is 1.
		ri.Put(t, ri.Write, "same", 0, `{"rev":5}`)
		ri.Put(t, ri.Write, "behind", 0, `{"rev":6}`)
		ri.Refresh(t)
		sql := `SELECT id, version, doc FROM ` + table
		rep, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name, SourceSQL: sql, VersionField: "rev"})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Counts[DriftStale] != 1 || rep.Counts[DriftAhead] != 0 || len(rep.Samples[DriftStale]) != 1 ||
			rep.Samples[DriftStale][0].SourceID != "behind" || rep.Samples[DriftStale][0].IndexVersion != 6 {
			t.Fatalf("counts %v samples %+v, want only behind stale at rev 6", rep.Counts, rep.Samples)
		}
		if _, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name, SourceSQL: sql, VersionField: "_version"}); err == nil || !strings.Contains(err.Error(), "version_field") {
			t.Fatalf("a metadata version field: %v, want a version_field error", err)
		}
	})

	t.Run("source SQL that writes is refused and writes nothing", func(t *testing.T) {
		t.Parallel()
		pool, schemaName, ri, _ := setup(t)
		s := `"` + schemaName + `"`
		if _, err := pool.Exec(ctx, `CREATE TABLE `+s+`.victims (id text, version bigint, doc jsonb);
			INSERT INTO `+s+`.victims VALUES ('a', 1, '{}'), ('b', 1, '{}');
			CREATE FUNCTION `+s+`.sneaky() RETURNS SETOF `+s+`.victims LANGUAGE sql AS
				$$ INSERT INTO `+s+`.victims VALUES ('c', 1, '{}') RETURNING * $$`); err != nil {
			t.Fatal(err)
		}
		for _, sql := range []string{
			`WITH d AS (DELETE FROM ` + s + `.victims RETURNING id, version, doc) SELECT * FROM d`,
			`SELECT * FROM ` + s + `.sneaky()`,
			`SELECT id, version, doc FROM ` + s + `.victims FOR UPDATE`,
		} {
			_, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name, SourceSQL: sql, Apply: true})
			if err == nil || !strings.Contains(err.Error(), "source_sql: must only read") {
				t.Errorf("%s: %v, want a read-only refusal", sql, err)
			}
		}
		var ids string
		if err := pool.QueryRow(ctx, `SELECT string_agg(id, ',' ORDER BY id) FROM `+s+`.victims`).Scan(&ids); err != nil || ids != "a,b" {
			t.Fatalf("the table holds %q (%v), want a,b untouched", ids, err)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.events`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d events appended (%v)", n, err)
		}
	})

	t.Run("source SQL that runs past the source timeout fails saying so", func(t *testing.T) {
		t.Parallel()
		pool, schemaName, ri, _ := setup(t)
		start := time.Now()
		_, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name,
			SourceSQL: `SELECT 'a', 1, '{}'::jsonb FROM pg_sleep(30)`, SourceTimeout: 300 * time.Millisecond})
		if err == nil || !strings.Contains(err.Error(), "did not finish within the source timeout of 300ms") {
			t.Fatalf("got %v, want a source timeout error", err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("took %s: the timeout did not stop the query", d)
		}
	})

	t.Run("bad source SQL names the problem", func(t *testing.T) {
		t.Parallel()
		pool, schemaName, ri, _ := setup(t)
		_, err := Run(ctx, Options{ES: ri.ES, DB: pool, Schema: schemaName, Index: ri.Name, SourceSQL: "SELECT 1, 2"})
		if err == nil || !strings.Contains(err.Error(), "source_sql: returns 2 columns") {
			t.Fatalf("err %v", err)
		}
	})
}

func reconItoa(v int64) string { return strconv.FormatInt(v, 10) }
