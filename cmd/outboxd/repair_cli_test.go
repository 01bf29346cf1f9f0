package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema/schematest"
)

// esDo sends one request to the test Elasticsearch and returns the body.
func esDo(t *testing.T, es *elasticsearch.Client, method, path, body string) []byte {
	t.Helper()
	req, _ := http.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := es.Perform(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, b)
	}
	return b
}

// liveIDs lists the _ids visible through the read alias.
func liveIDs(t *testing.T, es *elasticsearch.Client, name string) []string {
	t.Helper()
	esDo(t, es, "POST", "/"+name+"/_refresh", "")
	var r struct {
		Hits struct {
			Hits []struct {
				ID string `json:"_id"`
			} `json:"hits"`
		} `json:"hits"`
	}
	if err := json.Unmarshal(esDo(t, es, "POST", "/"+indexer.ReadAlias(name)+"/_search", `{"size":100,"sort":["_doc"]}`), &r); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(r.Hits.Hits))
	for _, h := range r.Hits.Hits {
		ids = append(ids, h.ID)
	}
	return ids
}

func TestRepairAndReconcileCommands(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	url := schematest.ElasticsearchURL(t)
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := schematest.Name("cli-")
	if err := indexer.Bootstrap(ctx, es, name, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", "/"+indexer.FirstIndex(name), nil)
		if res, err := es.Perform(req); err == nil {
			res.Body.Close()
		}
	})
	// A legacy writer left s1 twice under random ids, and s2 once under its own.
	esDo(t, es, "PUT", "/"+name+"/_doc/legacy-a", `{"source_id":"s1","version":1,"title":"old"}`)
	esDo(t, es, "PUT", "/"+name+"/_doc/legacy-b", `{"source_id":"s1","version":2,"title":"new"}`)
	esDo(t, es, "PUT", "/"+name+"/_doc/s2", `{"source_id":"s2","version":1,"title":"two"}`)
	esArgs := []string{"--elasticsearch-url", url}
	dir := t.TempDir()
	backup := filepath.Join(dir, "backup.ndjson")

	t.Run("repair without --apply changes nothing", func(t *testing.T) {
		err := runRepair(ctx, append(esArgs, "--index", name, "--key", "source_id"))
		if c := exitCode(err); c != 0 {
			t.Fatalf("dry run exit %d: %v", c, err)
		}
		if ids := liveIDs(t, es, name); len(ids) != 3 {
			t.Fatalf("dry run changed the index: %v", ids)
		}
	})

	t.Run("repair --apply leaves one document per source, at _id = source_id, with the newest version", func(t *testing.T) {
		err := runRepair(ctx, append(esArgs, "--index", name, "--key", "source_id", "--apply",
			"--backup", backup, "--audit-log", filepath.Join(dir, "audit.jsonl"), "--operator", "test"))
		if c := exitCode(err); c != 0 {
			t.Fatalf("apply exit %d: %v", c, err)
		}
		ids := liveIDs(t, es, name)
		if fmt.Sprint(sorted(ids)) != "[s1 s2]" {
			t.Fatalf("after repair: %v", ids)
		}
		if b := esDo(t, es, "GET", "/"+name+"/_doc/s1", ""); !strings.Contains(string(b), `"title":"new"`) {
			t.Fatalf("keeper is not the newest: %s", b)
		}
	})

	t.Run("repair restore puts the original documents back", func(t *testing.T) {
		err := runRepair(ctx, append(append([]string{"restore"}, esArgs...), "--audit-log", filepath.Join(dir, "audit.jsonl"), "--operator", "test", backup))
		if c := exitCode(err); c != 0 {
			t.Fatalf("restore exit %d: %v", c, err)
		}
		if ids := liveIDs(t, es, name); fmt.Sprint(sorted(ids)) != "[legacy-a legacy-b s2]" {
			t.Fatalf("after restore: %v", ids)
		}
	})

	t.Run("reconcile reports drift with exit 3 and --apply appends fix events", func(t *testing.T) {
		if _, err := e.pool.Exec(ctx, `CREATE TABLE "`+e.schema+`".truth (id text, version bigint, doc jsonb);
			INSERT INTO "`+e.schema+`".truth VALUES ('s2', 1, '{"source_id":"s2","version":1,"title":"two"}'), ('s3', 4, '{"title":"missing"}')`); err != nil {
			t.Fatal(err)
		}
		sql := `SELECT id, version, doc FROM "` + e.schema + `".truth`
		args := append(append(append([]string{}, e.dbArgs...), esArgs...), "--index", name, "--source-sql", sql)
		if c := exitCode(runReconcile(ctx, args)); c != 3 {
			t.Fatalf("reconcile exit %d, want 3 (drift)", c)
		}
		var n int
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".events`).Scan(&n)
		if n != 0 {
			t.Fatalf("a report-only reconcile appended %d events", n)
		}
		_ = runReconcile(ctx, append(args, "--apply"))
		var s3 int
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".events WHERE source_id = 's3' AND op = 'upsert' AND version = 4`).Scan(&s3)
		if s3 != 1 {
			t.Fatalf("no upsert event for the missing document s3 at version 4")
		}
	})

	t.Run("reconcile refuses source SQL that writes, one that runs too long and a zero timeout", func(t *testing.T) {
		base := append(append(append([]string{}, e.dbArgs...), esArgs...), "--index", name)
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--source-sql", `WITH d AS (DELETE FROM "` + e.schema + `".truth RETURNING id, version, doc) SELECT * FROM d`}, "source_sql: must only read"},
			{[]string{"--source-sql", `SELECT id, version, doc FROM "` + e.schema + `".truth, pg_sleep(10)`, "--source-timeout", "200ms"}, "source timeout of 200ms"},
			{[]string{"--source-sql", `SELECT 1`, "--source-timeout", "0s"}, "source-timeout: must be > 0"},
			{[]string{"--source-sql", `SELECT 1`, "--version-field", "_version"}, "version_field"},
		} {
			if err := runReconcile(ctx, append(append([]string{}, base...), c.args...)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: %v, want %q", c.args, err, c.want)
			}
		}
		var rows int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".truth`).Scan(&rows); err != nil || rows != 2 {
			t.Fatalf("truth has %d rows (%v), want its 2 untouched", rows, err)
		}
	})
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestRepairIncludeMissingKeyFlag(t *testing.T) {
	t.Parallel()
	t.Run("is refused with a key that cannot fall back to _id", func(t *testing.T) {
		err := runRepair(context.Background(), []string{"--elasticsearch-url", "http://127.0.0.1:1", "--index", "x", "--key", "canonical_url", "--include-missing-key"})
		if err == nil || !strings.Contains(err.Error(), "include_missing_key") {
			t.Fatalf("err %v, want an include_missing_key error", err)
		}
	})
}
