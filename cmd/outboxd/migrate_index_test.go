package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema/schematest"
)

// Not parallel: a relay started by a parallel test without --indexes
// upgrades every index of the earlier layout on the shared server at its
// start, this test's too, and the check before the upgrade then found it
// done (a CI run under load). Parallel tests do not run beside it.
func TestMigrateIndexCommand(t *testing.T) {
	url := schematest.ElasticsearchURL(t)
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := schematest.Name("cli-mig-")
	t.Cleanup(func() { esDo(t, es, "DELETE", "/"+indexer.FirstIndex(name)+"?ignore_unavailable=true", "") })
	// The layout of earlier releases: N the unfiltered write alias.
	esDo(t, es, "PUT", "/"+indexer.FirstIndex(name), `{"settings":{"number_of_replicas":0},"aliases":{"`+name+`":{"is_write_index":true},"`+indexer.ReadAlias(name)+`":{"filter":`+indexer.ReadFilter+`}}}`)
	esDo(t, es, "PUT", "/"+name+"/_doc/live?version=1&version_type=external&refresh=true", `{"title":"live"}`)
	esDo(t, es, "PUT", "/"+name+"/_doc/gone?version=2&version_type=external&refresh=true", `{"outboxd_deleted":true}`)
	esArgs := []string{"--elasticsearch-url", url}

	t.Run("migrate-index without --index or --all is refused", func(t *testing.T) {
		if err := runMigrateIndex(ctx, esArgs); err == nil || !strings.Contains(err.Error(), "--index N or --all") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("migrate-index --index N makes the plain name hide tombstones", func(t *testing.T) {
		if ids := liveIDs(t, es, name); len(ids) != 1 {
			t.Fatalf("the read alias before: %v", ids)
		}
		if b := esDo(t, es, "POST", "/"+name+"/_count", ""); !strings.Contains(string(b), `"count":2`) {
			t.Fatalf("before the upgrade %s should still count the tombstone: %s", name, b)
		}
		if err := runMigrateIndex(ctx, append(esArgs, "--index", name)); err != nil {
			t.Fatal(err)
		}
		if b := esDo(t, es, "POST", "/"+name+"/_count", ""); !strings.Contains(string(b), `"count":1`) {
			t.Fatalf("after the upgrade: %s", b)
		}
		if b := esDo(t, es, "POST", "/"+indexer.WriteAlias(name)+"/_count", ""); !strings.Contains(string(b), `"count":2`) {
			t.Fatalf("the write alias: %s", b)
		}
	})

	t.Run("migrate-index of a name that does not exist fails", func(t *testing.T) {
		if err := runMigrateIndex(ctx, append(esArgs, "--index", name+"-nope")); err == nil || !strings.Contains(err.Error(), "no index or alias") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestRelayUpgradesLayoutsAtStart(t *testing.T) {
	t.Parallel()
	e := cliSetup(t)
	url := schematest.ElasticsearchURL(t)
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	name := schematest.Name("cli-up-")
	t.Cleanup(func() { esDo(t, es, "DELETE", "/"+indexer.FirstIndex(name)+"?ignore_unavailable=true", "") })
	esDo(t, es, "PUT", "/"+indexer.FirstIndex(name), `{"settings":{"number_of_replicas":0},"aliases":{"`+name+`":{"is_write_index":true},"`+indexer.ReadAlias(name)+`":{"filter":`+indexer.ReadFilter+`}}}`)
	esDo(t, es, "PUT", "/"+name+"/_doc/gone?version=2&version_type=external&refresh=true", `{"outboxd_deleted":true}`)

	t.Run("a relay started on an index of an earlier release upgrades it without any event to deliver", func(t *testing.T) {
		startCommand(t, append([]string{"relay", "--elasticsearch-url", url, "--admin-addr", "", "--indexes", name, "--upgrade-layouts=true"}, e.dbArgs...)...)
		schematest.Eventually(t, 20*time.Second, name+" hides the tombstone", func() bool {
			return strings.Contains(string(esDo(t, es, "POST", "/"+name+"/_count", "")), `"count":0`)
		})
		if b := esDo(t, es, "POST", "/"+indexer.WriteAlias(name)+"/_count", ""); !strings.Contains(string(b), `"count":1`) {
			t.Fatalf("the write alias: %s", b)
		}
	})
}
