package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxd/outboxd/documents"
)

func init() {
	register("documents", "declare the SQL that builds an index's documents from several tables, and the triggers that refresh them (audited)", runDocuments)
}

const documentsUsage = `Usage:
  outboxd documents define  --index N --sql-file F [--ids-sql SQL] [--check-timeout 5s] [--operator NAME]
  outboxd documents list    [--json]
  outboxd documents drop    --index N [--operator NAME]
  outboxd documents watch   --index N --table T --key KEY [--operator NAME]
  outboxd documents unwatch --index N --table T [--operator NAME]

A definition-fed index N takes its documents from SQL returning (source_id text, document
jsonb) for the ids in $1 (a text[]). define checks it (it must prepare, return exactly those
two columns, and run read-only on an empty id list within --check-timeout) and stores it; the
relay then answers every refresh(N, id) with what the SQL returns for id now, or a tombstone.
--ids-sql (SELECT id FROM tutorials) lists every source_id of N, for the tools that read all
of N from its definition: backfill, reconcile and rebuild --from source without --source-sql.
watch installs a trigger on T that refreshes the ids KEY gives for each changed row ($1 is the
row): a column (tutorial_id), an expression ($1.tutorial_id) or a query
(SELECT t.id FROM tutorials t WHERE t.author_id = $1.id). Every change goes to audit_log
with the operator (--operator, default the OS user).
`

func runDocuments(ctx context.Context, args []string) error {
	return documentsCmd(ctx, args, os.Stdout)
}

func documentsCmd(ctx context.Context, args []string, out io.Writer) error {
	actions := []string{"define", "list", "drop", "watch", "unwatch"}
	if len(args) == 0 || !slices.Contains(actions, args[0]) {
		fmt.Fprint(os.Stderr, documentsUsage)
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			return &exitError{2, errors.New("missing action: define, list, drop, watch or unwatch")}
		}
		return &exitError{2, fmt.Errorf("unknown action %q: want define, list, drop, watch or unwatch", args[0])}
	}
	action, args := args[0], args[1:]
	fs := flag.NewFlagSet("documents "+action, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), documentsUsage+"\nFlags:\n")
		fs.PrintDefaults()
	}
	db := addDBFlags(fs)
	var index, sqlFile, idsSQL, table, key, operator string
	checkTimeout := documents.DefaultCheckTimeout
	asJSON := fs.Bool("json", false, "print JSON")
	if action != "list" {
		fs.StringVar(&index, "index", "", "the index name")
		fs.StringVar(&operator, "operator", "", "who acts, for the audit log (default: the OS user)")
	}
	switch action {
	case "define":
		fs.StringVar(&sqlFile, "sql-file", "", "file holding the definition's SQL (- for standard input)")
		fs.StringVar(&idsSQL, "ids-sql", "", "query returning every source_id of --index, one column (default: keep the one declared before, if any)")
		fs.DurationVar(&checkTimeout, "check-timeout", documents.DefaultCheckTimeout, "statement timeout of the definition's trial run")
	case "watch", "unwatch":
		fs.StringVar(&table, "table", "", "the contributing table (schema-qualified, or on the search_path)")
		if action == "watch" {
			fs.StringVar(&key, "key", "", "the ids of --index a row of --table contributes to, $1 the row: a column, an expression or a SELECT")
		}
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if action != "list" {
		if index == "" {
			return errors.New("index: --index is required")
		}
		var err error
		if operator, err = operatorName(operator); err != nil {
			return err
		}
	}
	var sql string
	switch {
	case action == "define" && sqlFile == "":
		return errors.New("sql-file: --sql-file is required")
	case action == "define":
		b, err := readSQLFile(sqlFile)
		if err != nil {
			return err
		}
		sql = b
	case (action == "watch" || action == "unwatch") && table == "":
		return errors.New("table: --table is required")
	case action == "watch" && strings.TrimSpace(key) == "":
		return errors.New("key: --key is required")
	}

	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch action {
	case "define":
		d, err := documents.Define(ctx, pool, db.schema, documents.DefineOptions{Index: index, SQL: sql, IDsSQL: idsSQL, Operator: operator, CheckTimeout: checkTimeout})
		if err != nil {
			return err
		}
		if *asJSON {
			return indentJSON(out, d)
		}
		fmt.Fprintf(out, "defined index %s (revision %d) as %s (recorded in audit_log)\n", d.Index, d.Revision, d.DefinedBy)
		if d.IDsSQL == "" {
			fmt.Fprintf(out, "no --ids-sql: backfill, reconcile and rebuild --from source cannot list the ids of %s until one is declared\n", d.Index)
		}
		if d.Revision > 1 {
			fmt.Fprintf(out, "documents already in the index keep the previous definition's content until refreshed: run `outboxd backfill --index %s` to read them all again\n", d.Index)
		}
		return nil
	case "list":
		defs, err := documents.List(ctx, pool, db.schema)
		if err != nil {
			return err
		}
		if *asJSON {
			if defs == nil {
				defs = []documents.Definition{}
			}
			return indentJSON(out, defs)
		}
		printDefinitions(out, defs)
		return nil
	case "drop":
		if err := documents.Drop(ctx, pool, db.schema, index, operator); err != nil {
			return err
		}
		fmt.Fprintf(out, "dropped the definition of index %s and its watches as %s (recorded in audit_log); the index in Elasticsearch is left as it is\n", index, operator)
		return nil
	case "watch":
		w, err := documents.AddWatch(ctx, pool, db.schema, documents.WatchOptions{Index: index, Table: table, Key: key, Operator: operator})
		if err != nil {
			return err
		}
		if *asJSON {
			return indentJSON(out, w)
		}
		fmt.Fprintf(out, "watching %s for index %s: a changed row refreshes %s (trigger %s; recorded in audit_log)\n", w.Table, w.Index, w.KeySQL, w.Trigger)
		return nil
	default:
		if err := documents.RemoveWatch(ctx, pool, db.schema, index, table, operator); err != nil {
			return err
		}
		fmt.Fprintf(out, "no longer watching %s for index %s (recorded in audit_log)\n", table, index)
		return nil
	}
}

func readSQLFile(name string) (string, error) {
	var b []byte
	var err error
	if name == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(name)
	}
	if err != nil {
		return "", fmt.Errorf("sql-file: %w", err)
	}
	// A trailing semicolon is how SQL files end; one statement is what
	// PostgreSQL prepares.
	return strings.TrimSuffix(strings.TrimSpace(string(b)), ";"), nil
}

func printDefinitions(out io.Writer, defs []documents.Definition) {
	if len(defs) == 0 {
		fmt.Fprintln(out, "no index has a document definition (outboxd documents define --index N --sql-file F)")
		return
	}
	for i, d := range defs {
		if i > 0 {
			fmt.Fprintln(out)
		}
		fmt.Fprintf(out, "index %s: revision %d, defined by %s at %s\n", d.Index, d.Revision, d.DefinedBy, d.DefinedAt.Format(time.RFC3339))
		fmt.Fprintf(out, "  %s\n", strings.ReplaceAll(strings.TrimSpace(d.SQL), "\n", "\n  "))
		if d.IDsSQL != "" {
			fmt.Fprintf(out, "  ids: %s\n", strings.ReplaceAll(strings.TrimSpace(d.IDsSQL), "\n", "\n  "))
		}
		if d.PreviousSQL != "" {
			fmt.Fprintf(out, "  (previous revision by %s at %s kept in the documents table)\n", d.PreviousBy, d.PreviousAt.Format(time.RFC3339))
		}
		if len(d.Watches) == 0 {
			fmt.Fprintln(out, "  no watched table: refreshes come only from refresh() calls")
			continue
		}
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  TABLE\tKEY\tBY\tSINCE")
		for _, w := range d.Watches {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", w.Table, w.Key, w.WatchedBy, w.WatchedAt.Format(time.RFC3339))
		}
		tw.Flush()
	}
}
