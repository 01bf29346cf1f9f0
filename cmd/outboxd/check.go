package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
)

func init() {
	register("check", "preflight of the relay's settings: PostgreSQL and the schema, search server, index spec, destinations, admin address; exit 1 on a problem", runCheck)
}

const checkUsage = "Usage: outboxd check [--config outboxd.yaml] [flags]\n\nChecks what outboxd relay needs, with the relay's settings (the same flags and --config file),\nwithout taking any event or sending any message: PostgreSQL answers and the schema has every\nmigration of this binary; the search server is a supported product and version; the server\nvalidates --index-spec (a simulated index template: nothing is created); every --destination\nhas an http(s) URL, its secret in the variable it names and a check SQL that prepares READ ONLY\nwith $1 and $2; the admin address can be bound. Prints one line per item, ok, problem or\nskipped (not checked, because what it needs failed), and exits 1 on any problem, 0 otherwise.\nThe relay runs the same checks at start and refuses a problem of its configuration (a server\nthat does not answer it waits for).\n\nFlags:"

func runCheck(ctx context.Context, args []string) error {
	return check(ctx, args, redactWriter{w: os.Stdout, r: secrets})
}

func check(ctx context.Context, args []string, out io.Writer) error {
	db, es, f, err := parseRelayFlagSet("check", checkUsage, args)
	if err != nil {
		return err
	}
	p := &preflight{db: db, es: es, f: f}
	var problems []string
	report := func(fs ...finding) {
		for _, f := range fs {
			switch {
			case f.problem():
				problems = append(problems, f.item)
				fmt.Fprintf(out, "problem  %s: %v\n", f.item, f.err)
			case f.skipped:
				fmt.Fprintf(out, "skipped  %s: %s\n", f.item, f.detail)
			default:
				fmt.Fprintf(out, "ok       %s: %s\n", f.item, f.detail)
			}
		}
	}

	pool, found := p.postgres(ctx)
	report(found)
	if pool != nil {
		defer pool.Close()
	}
	report(p.schemaVersion(ctx, pool))
	esCfg, client, server := p.search(ctx)
	report(server)
	if server.problem() {
		client = nil
	}
	report(p.indexSpec(ctx, client, len(esCfg.Addresses)))
	report(p.destinations(ctx, pool)...)
	report(p.adminAddr())

	if ctx.Err() != nil {
		return ctx.Err()
	}
	if len(problems) > 0 {
		noun := "problem"
		if len(problems) > 1 {
			noun = "problems"
		}
		return &exitError{code: 1, err: fmt.Errorf("%d %s: %s", len(problems), noun, strings.Join(problems, ", "))}
	}
	return nil
}
