package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema/schematest"
)

// The tools that read a whole index take a definition-fed index's
// documents from its definition when --source-sql is left out, and say
// which flag is missing (and why) for an index without one.
func TestDocumentsTools(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := schematest.ElasticsearchURL(t)
	es, err := indexer.NewClient(indexer.ClientConfig{Addresses: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	e := cliSetup(t)
	name := schematest.Name("cli-docs-")
	t.Cleanup(func() { esDo(t, es, "DELETE", "/"+name+"-0*?ignore_unavailable=true", "") })
	id := pgx.Identifier{e.schema}.Sanitize()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+id+`.authors (id int PRIMARY KEY, name text);
		CREATE TABLE `+id+`.tutorials (id int PRIMARY KEY, title text, author_id int);
		INSERT INTO `+id+`.authors VALUES (1, 'ann'), (2, 'bob');
		INSERT INTO `+id+`.tutorials SELECT i, 'tutorial ' || i, 1 + i % 2 FROM generate_series(1, 10) i`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	def := filepath.Join(dir, "tutorials.sql")
	if err := os.WriteFile(def, []byte(`SELECT t.id::text, jsonb_build_object('title', t.title, 'author', a.name)
FROM `+id+`.tutorials t JOIN `+id+`.authors a ON a.id = t.author_id WHERE t.id::text = ANY($1);
`), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(spec, []byte(`{"settings":{"index":{"number_of_shards":1,"number_of_replicas":0}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	with := func(args ...string) []string {
		return append(append([]string{"--elasticsearch-url", url}, args...), e.dbArgs...)
	}

	// Not defined yet: each tool names --source-sql and says why.
	for tool, run := range map[string]func() error{
		"backfill":  func() error { return runBackfill(ctx, with("--index", name, "--index-spec", spec)) },
		"reconcile": func() error { return runReconcile(ctx, with("--index", name)) },
		"rebuild":   func() error { return runRebuild(ctx, with("--index", name, "--from", "source")) },
	} {
		if err := run(); err == nil || !strings.Contains(err.Error(), "source-sql: required: index "+name+" has no document definition") {
			t.Errorf("%s of an index without a definition: %v", tool, err)
		}
	}
	var out strings.Builder
	if err := documentsCmd(ctx, append([]string{"define", "--index", name, "--sql-file", def, "--ids-sql", "SELECT id FROM " + id + ".tutorials", "--operator", "ops"}, e.dbArgs...), &out); err != nil {
		t.Fatal(err)
	}
	if err := runBackfill(ctx, with("--index", name, "--source-sql", "SELECT id, 1, '{}'::jsonb FROM "+id+".tutorials", "--index-spec", spec)); err == nil || !strings.Contains(err.Error(), "source-sql: index "+name+" is definition-fed") {
		t.Errorf("backfill of a definition-fed index with --source-sql: %v", err)
	}

	if err := runBackfill(ctx, with("--index", name, "--index-spec", spec)); err != nil {
		t.Fatal(err)
	}
	if b := esDo(t, es, "GET", "/"+name+"/_doc/3", ""); !strings.Contains(string(b), `"bob"`) {
		t.Fatalf("tutorial 3 after the backfill: %s", b)
	}
	if err := runReconcile(ctx, with("--index", name)); err != nil {
		t.Fatalf("reconcile right after the backfill: %v", err)
	}
	// The watch-less rename is drift reconcile finds, and --apply fixes
	// it with refreshes.
	if _, err := e.pool.Exec(ctx, `UPDATE `+id+`.authors SET name = 'ann2' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if err := runReconcile(ctx, with("--index", name)); exitCode(err) != 3 {
		t.Fatalf("reconcile after a rename: %v; want exit status 3", err)
	}
	if err := runReconcile(ctx, with("--index", name, "--apply", "--operator", "ops")); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+id+`.events WHERE op = 'refresh' AND index_name = $1`, name).Scan(&n); err != nil || n != 5 {
		t.Fatalf("refreshes appended: %d, %v; want the 5 tutorials of ann", n, err)
	}

	// The relay's scheduled reconcile takes the definition as the truth
	// too: with --reconcile-index and no --reconcile-sql it finds another
	// watch-less rename and its refreshes reach the index.
	if _, err := e.pool.Exec(ctx, `UPDATE `+id+`.authors SET name = 'bob2' WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	cmd, logs := startCommand(t, append([]string{"relay"}, with("--admin-addr", "", "--lease-interval", "100ms",
		"--reconcile-schedule", "@every 1s", "--reconcile-apply", "--reconcile-index", name)...)...)
	schematest.Eventually(t, 60*time.Second, "the scheduled reconcile's refreshes show bob2 and ann2", func() bool {
		if cmd.ProcessState != nil {
			t.Fatalf("the relay exited:\n%s", logs.String())
		}
		return strings.Contains(string(esDo(t, es, "GET", "/"+name+"/_doc/3", "")), `"bob2"`) &&
			strings.Contains(string(esDo(t, es, "GET", "/"+name+"/_doc/2", "")), `"ann2"`)
	})
}
