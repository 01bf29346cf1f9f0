package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestDocumentsCommand(t *testing.T) {
	t.Parallel()

	t.Run("define, watch, list, unwatch and drop work from the command line and name what is wrong", func(t *testing.T) {
		t.Parallel()
		e := cliSetup(t)
		ctx := context.Background()
		id := pgx.Identifier{e.schema}.Sanitize()
		if _, err := e.pool.Exec(ctx, `CREATE TABLE `+id+`.authors (id int PRIMARY KEY, name text);
			CREATE TABLE `+id+`.tutorials (id int PRIMARY KEY, title text, author_id int)`); err != nil {
			t.Fatal(err)
		}
		run := func(args ...string) (string, error) {
			var out bytes.Buffer
			if args[0] != "list" {
				args = append(args, "--operator", "ops")
			}
			err := documentsCmd(ctx, append(args, e.dbArgs...), &out)
			return out.String(), err
		}
		dir := t.TempDir()
		good := filepath.Join(dir, "tutorials.sql")
		if err := os.WriteFile(good, []byte(`SELECT t.id::text, jsonb_build_object('title', t.title, 'author', a.name)
FROM `+id+`.tutorials t JOIN `+id+`.authors a ON a.id = t.author_id WHERE t.id::text = ANY($1);
`), 0o600); err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(dir, "bad.sql")
		if err := os.WriteFile(bad, []byte(`SELECT t.id, t.title FROM `+id+`.tutorials t WHERE t.id::text = ANY($1)`), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := run("define", "--index", "tutorials", "--sql-file", bad); err == nil || !strings.Contains(err.Error(), "must be text") {
			t.Fatalf("define with a bad SQL: %v", err)
		}
		if out, err := run("define", "--index", "tutorials", "--sql-file", good); err != nil || !strings.Contains(out, "defined index tutorials (revision 1) as ops") {
			t.Fatalf("define: %q, %v", out, err)
		}
		if out, err := run("watch", "--index", "tutorials", "--table", e.schema+".tutorials", "--key", "id"); err != nil || !strings.Contains(out, "watching") {
			t.Fatalf("watch: %q, %v", out, err)
		}
		if out, err := run("watch", "--index", "tutorials", "--table", e.schema+".authors", "--key", "SELECT t.id FROM "+id+".tutorials t WHERE t.author_id = $1.id"); err != nil {
			t.Fatalf("watch: %q, %v", out, err)
		}
		if _, err := run("watch", "--index", "tutorials", "--table", e.schema+".authors", "--key", "nope"); err == nil || !strings.Contains(err.Error(), `no column "nope"`) {
			t.Fatalf("watch with a bad key: %v", err)
		}
		out, err := run("list")
		if err != nil || !strings.Contains(out, "index tutorials: revision 1, defined by ops") || !strings.Contains(out, e.schema+".authors") {
			t.Fatalf("list: %q, %v", out, err)
		}
		if _, err := run("unwatch", "--index", "tutorials", "--table", e.schema+".authors"); err != nil {
			t.Fatal(err)
		}
		if out, err := run("drop", "--index", "tutorials"); err != nil || !strings.Contains(out, "dropped") {
			t.Fatalf("drop: %q, %v", out, err)
		}
		if out, err := run("list"); err != nil || !strings.Contains(out, "no index has a document definition") {
			t.Fatalf("list after drop: %q, %v", out, err)
		}
		if _, err := run("define", "--index", "tutorials"); err == nil || !strings.Contains(err.Error(), "sql-file") {
			t.Fatalf("define without --sql-file: %v", err)
		}
		if err := documentsCmd(ctx, []string{"nope"}, &bytes.Buffer{}); exitCode(err) != 2 {
			t.Fatalf("an unknown action: %v", err)
		}
	})
}
