package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema/schematest"
)

func TestBackfillCreatesIndexWithSpec(t *testing.T) {
	t.Parallel()
	url := schematest.ElasticsearchURL(t)
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	env := cliSetup(t)
	name := schematest.Name("cli-bf-spec-")
	t.Cleanup(func() { esDo(t, es, "DELETE", "/"+indexer.FirstIndex(name)+"?ignore_unavailable=true", "") })
	if _, err := env.pool.Exec(ctx, `CREATE TABLE "`+env.schema+`".items AS SELECT g::text AS id, 1::bigint AS version, json_build_object('title', 'item ' || g) AS doc FROM generate_series(1, 5) g`); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--elasticsearch-url", url, "--index", name, "--source-sql", `SELECT id, version, doc FROM "` + env.schema + `".items`}, env.dbArgs...)

	err = runBackfill(ctx, args)
	if err == nil || !strings.Contains(err.Error(), "--index-spec") {
		t.Fatalf("backfill into a missing index without --index-spec: %v; want a refusal naming --index-spec", err)
	}
	if b := esDo(t, es, "GET", "/"+indexer.FirstIndex(name)+"?ignore_unavailable=true", ""); strings.Contains(string(b), indexer.FirstIndex(name)) {
		t.Fatalf("the refused backfill created the index: %s", b)
	}

	spec := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(spec, []byte(`{"settings":{"index":{"number_of_shards":2,"number_of_replicas":0}},"mappings":{"properties":{"title":{"type":"text"}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := runBackfill(ctx, append(args, "--index-spec", spec)); err != nil {
		t.Fatal(err)
	}
	if b := esDo(t, es, "GET", "/"+indexer.FirstIndex(name)+"/_settings/index.number_of_shards", ""); !strings.Contains(string(b), `"number_of_shards":"2"`) {
		t.Fatalf("the index backfill created does not have the spec's shards: %s", b)
	}
	if b := esDo(t, es, "GET", "/"+indexer.FirstIndex(name)+"/_mapping/field/title", ""); !strings.Contains(string(b), `"type":"text"`) {
		t.Fatalf("the index backfill created does not have the spec's mapping: %s", b)
	}
	// Once it exists, backfill needs no spec.
	if err := runBackfill(ctx, append(args, "--restart")); err != nil {
		t.Fatalf("a second backfill into the existing index: %v", err)
	}
}
