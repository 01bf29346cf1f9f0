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

func TestRebuildCommand(t *testing.T) {
	t.Parallel()
	url := schematest.ElasticsearchURL(t)
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	env := cliSetup(t)
	name := schematest.Name("cli-rb-")
	t.Cleanup(func() {
		for _, ix := range []string{indexer.FirstIndex(name), name + "-000002"} {
			esDo(t, es, "DELETE", "/"+ix+"?ignore_unavailable=true", "")
		}
	})
	if err := indexer.Bootstrap(ctx, es, name, []byte(`{"mappings":{"properties":{"title":{"type":"keyword"}}}}`)); err != nil {
		t.Fatal(err)
	}
	esDo(t, es, "PUT", "/"+indexer.WriteAlias(name)+"/_doc/live?version=1&version_type=external&refresh=true", `{"title":"a live title"}`)
	esDo(t, es, "PUT", "/"+indexer.WriteAlias(name)+"/_doc/gone?version=2&version_type=external&refresh=true", `{"outboxd_deleted":true}`)
	args := append([]string{"--elasticsearch-url", url, "--index", name}, env.dbArgs...)
	mappings := filepath.Join(t.TempDir(), "mappings.json")
	if err := os.WriteFile(mappings, []byte(`{"mappings":{"properties":{"title":{"type":"text"}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("abort and drop-old with nothing to act on fail with the reason", func(t *testing.T) {
		if err := runRebuild(ctx, append(args, "--abort")); err == nil || !strings.Contains(err.Error(), "nothing to abort") {
			t.Fatalf("abort: %v", err)
		}
		if err := runRebuild(ctx, append(args, "--drop-old")); err == nil || !strings.Contains(err.Error(), "no finished rebuild") {
			t.Fatalf("drop-old: %v", err)
		}
		if err := runRebuild(ctx, append(args, "--mappings", mappings+".missing")); err == nil || !strings.Contains(err.Error(), "mappings:") {
			t.Fatalf("missing file: %v", err)
		}
	})

	t.Run("rebuild --mappings swaps the name to a new index with the new mapping, the tombstone kept; --drop-old removes the old one", func(t *testing.T) {
		if err := runRebuild(ctx, append(args, "--mappings", mappings, "--grace", "100ms", "--json")); err != nil {
			t.Fatal(err)
		}
		if b := esDo(t, es, "GET", "/"+name+"/_alias", ""); !strings.Contains(string(b), name+"-000002") || strings.Contains(string(b), indexer.FirstIndex(name)) {
			t.Fatalf("aliases: %s", b)
		}
		if b := esDo(t, es, "POST", "/"+name+"/_count", `{"query":{"match":{"title":"live"}}}`); !strings.Contains(string(b), `"count":1`) {
			t.Fatalf("a word of the text title: %s", b)
		}
		if b := esDo(t, es, "POST", "/"+indexer.WriteAlias(name)+"/_count", ""); !strings.Contains(string(b), `"count":2`) {
			t.Fatalf("the tombstone was not copied: %s", b)
		}
		if err := runRebuild(ctx, append(args, "--drop-old")); err != nil {
			t.Fatal(err)
		}
		if b := esDo(t, es, "GET", "/"+indexer.FirstIndex(name)+"?ignore_unavailable=true", ""); strings.Contains(string(b), indexer.FirstIndex(name)) {
			t.Fatalf("the old index is still there: %s", b)
		}
	})
}
