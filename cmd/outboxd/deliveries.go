package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/outboxd/outboxd/webhook"
)

func init() {
	register("deliveries", "list webhook messages by state, resolve unknown or failed ones (audited)", runDeliveries)
}

const deliveriesUsage = `Usage:
  outboxd deliveries list    [--state waiting|reserved|delivered|failed|skipped|unknown] [--destination D] [--limit 100] [--json]
  outboxd deliveries resolve KEY --destination D (--delivered | --failed | --retry) [--operator NAME] [--json]

The delivery ledger has one row per (destination, dedupe key). A message whose request may have
reached a receiver that does not dedupe (a timeout or a reset after sending, or a relay stopped
mid-request) is "unknown" and is never sent again on its own: check with the receiver, then
resolve it --delivered (it arrived), --failed (give up) or --retry (send it again under the same
Idempotency-Key). Failed and skipped messages can be resolved the same way. A message retried
(or appended) for a destination no live relay serves is "waiting" until a relay with that
--destination starts. Every resolution is recorded in audit_log with the operator (--operator,
default the OS user).
`

func runDeliveries(ctx context.Context, args []string) error {
	return deliveries(ctx, args, os.Stdout)
}

func deliveries(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "resolve") {
		fmt.Fprint(os.Stderr, deliveriesUsage)
		return &exitError{2, errors.New("missing action: list or resolve")}
	}
	action, args := args[0], args[1:]
	fs := flag.NewFlagSet("deliveries "+action, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), deliveriesUsage+"\nFlags:\n")
		fs.PrintDefaults()
	}
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	var f webhook.Filter
	fs.StringVar(&f.Destination, "destination", "", "only this destination (required for resolve)")
	var delivered, failed, retry bool
	var operator string
	switch action {
	case "list":
		fs.StringVar(&f.State, "state", "", "only this state: waiting, reserved, delivered, failed, skipped or unknown")
		fs.IntVar(&f.Limit, "limit", 100, "rows at most, oldest first")
	case "resolve":
		fs.BoolVar(&delivered, "delivered", false, "the receiver has it")
		fs.BoolVar(&failed, "failed", false, "give up on it")
		fs.BoolVar(&retry, "retry", false, "send it again under the same Idempotency-Key")
		fs.StringVar(&operator, "operator", "", "who acts, for the audit log (default: the OS user)")
	}
	// The key may stand before, between or after the flags.
	var key string
	if action == "resolve" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		key, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if action == "resolve" && key == "" && fs.NArg() > 0 {
		key = fs.Arg(0)
		if err := parseFlags(fs, fs.Args()[1:]); err != nil {
			return err
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}

	var resolution string
	if action == "resolve" {
		n := 0
		for v, on := range map[string]bool{webhook.ResolveDelivered: delivered, webhook.ResolveFailed: failed, webhook.ResolveRetry: retry} {
			if on {
				resolution = v
				n++
			}
		}
		switch {
		case key == "":
			return errors.New("resolve: the message's dedupe key is required: outboxd deliveries resolve KEY --destination D ...")
		case f.Destination == "":
			return errors.New("destination: resolve needs --destination")
		case n != 1:
			return errors.New("resolve: give exactly one of --delivered, --failed or --retry")
		}
		var err error
		if operator, err = operatorName(operator); err != nil {
			return err
		}
	}
	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	if action == "resolve" {
		d, err := webhook.Resolve(ctx, pool, db.schema, f.Destination, key, resolution, operator)
		if err != nil {
			return err
		}
		if *asJSON {
			return indentJSON(out, d)
		}
		fmt.Fprintf(out, "%s/%s resolved %s by %s (recorded in audit_log); state now %s\n", d.Destination, d.DedupeKey, resolution, operator, d.State)
		return nil
	}
	ds, err := webhook.List(ctx, pool, db.schema, f)
	if err != nil {
		return err
	}
	if *asJSON {
		if ds == nil {
			ds = []webhook.Delivery{}
		}
		return indentJSON(out, ds)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "DESTINATION\tKEY\tSTATE\tATTEMPTS\tHTTP\tDUPLICATES\tRESERVED\tLAST ERROR")
	for _, d := range ds {
		code := "-"
		if d.LastStatus != nil {
			code = fmt.Sprint(*d.LastStatus)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", d.Destination, d.DedupeKey, d.State, d.Attempts, code, d.Duplicates,
			d.ReservedAt.UTC().Format("2006-01-02 15:04:05"), clipLine(d.LastError, 80))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(ds) == f.Limit {
		fmt.Fprintf(out, "(first %d rows; more may follow: raise --limit or filter)\n", f.Limit)
	}
	return nil
}
