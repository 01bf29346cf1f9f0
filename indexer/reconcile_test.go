package indexer

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/schema/schematest"
)

// seedReconcile writes one source table and one index family that
// disagree in every way the issue lists.
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
func seedReconcile(t *testing.T, pool *pgxpool.Pool, schemaName string, ri *repairIndex) string {
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
	w := ri.write
	ri.put(t, w, "ok", 2, `{"title":"ok"}`)
	ri.put(t, w, "stale", 3, `{"title":"stale v3"}`)
	ri.put(t, w, "extra", 4, `{"title":"extra"}`)
	ri.put(t, w, "resur", 3, `{"title":"resur"}`)
	ri.put(t, w, "tomb", 2, tombstoneBody())
	ri.put(t, w, "dup", 2, `{"title":"dup"}`)
	ri.put(t, w, "legacy-dup", 0, `{"source_id":"dup","title":"dup"}`)
	ri.put(t, w, "buried", 4, tombstoneBody())
	ri.put(t, w, "ahead", 2, `{"title":"ahead v2"}`)
	ri.put(t, w, "same", 2, `{"title":"same"}`)
	ri.refresh(t)
	return `SELECT id, version, doc, deleted FROM ` + table
}

func TestReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setup := func(t *testing.T) (*pgxpool.Pool, string, *repairIndex, string) {
		pool, schemaName := schematest.Setup(t)
		ri := setupRepairIndex(t, false)
		return pool, schemaName, ri, seedReconcile(t, pool, schemaName, ri)
	}
	wantCounts := map[string]int64{DriftMissing: 2, DriftStale: 1, DriftExtra: 1, DriftResurrected: 1, DriftDuplicate: 1, DriftAhead: 1}

	t.Run("a dry run detects each kind of drift and appends nothing", func(t *testing.T) {
		t.Parallel()
		pool, schemaName, ri, sql := setup(t)
		rep, err := Reconcile(ctx, ReconcileOptions{ES: ri.es, DB: pool, Schema: schemaName, Index: ri.name, SourceSQL: sql, Sample: 5})
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
		rep, err := Reconcile(ctx, ReconcileOptions{ES: ri.es, DB: pool, Schema: schemaName, Index: ri.name, SourceSQL: sql, Apply: true, Operator: "tester"})
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
			if idx != ri.name {
				t.Errorf("event for %s has index_name %q, want the write alias %q", sid, idx, ri.name)
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
		if err := pool.QueryRow(ctx, `SELECT version FROM "`+schemaName+`".versions WHERE index_name = $1 AND source_id = 'extra'`, ri.name).Scan(&counter); err != nil || counter != 5 {
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
				doc = []byte(tombstoneBody())
			}
			if _, status := ri.rawStatus(t, "PUT", "/"+ri.name+"/_doc/"+sid+"?version="+reconItoa(v)+"&version_type=external_gte", string(doc)); status >= 300 {
				t.Errorf("fix for %s at version %d lost the version gate: status %d", sid, v, status)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		ri.refresh(t)
		again, err := Reconcile(ctx, ReconcileOptions{ES: ri.es, DB: pool, Schema: schemaName, Index: ri.name, SourceSQL: sql})
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

	t.Run("bad source SQL names the problem", func(t *testing.T) {
		t.Parallel()
		pool, schemaName, ri, _ := setup(t)
		_, err := Reconcile(ctx, ReconcileOptions{ES: ri.es, DB: pool, Schema: schemaName, Index: ri.name, SourceSQL: "SELECT 1, 2"})
		if err == nil || !strings.Contains(err.Error(), "source_sql: returns 2 columns") {
			t.Fatalf("err %v", err)
		}
	})
}

func reconItoa(v int64) string { return strconv.FormatInt(v, 10) }
