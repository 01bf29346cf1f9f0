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
	"time"

	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/webhook"
)

func init() {
	register("deliveries", "list webhook messages by state, resolve unknown or failed ones (audited)", runDeliveries)
}

const deliveriesUsage = `Usage:
  outboxd deliveries list    [--state waiting|reserved|retrying|delivered|failed|skipped|unknown] [--destination D] [--limit 100] [--json]
  outboxd deliveries resolve KEY --destination D (--delivered | --failed | --retry) [--operator NAME] [--json]

The delivery ledger has one row per (destination, dedupe key). A message whose request may have
reached a receiver that does not dedupe (a timeout or a reset after sending, or a relay stopped
mid-request) is "unknown" and is never sent again on its own: check with the receiver, then
resolve it --delivered (it arrived), --failed (give up) or --retry (send it again under the same
Idempotency-Key). Failed and skipped messages can be resolved the same way, and so can a
retrying one (parked between attempts: NEXT ATTEMPT says when its destination's leader sends it
again), and a reserved one while no relay leads its destination's stream (a leader died
mid-request). A message retried
(or appended) for a destination no live relay serves is "waiting" until a relay with that
--destination starts. Every resolution is recorded in audit_log with the operator (--operator,
default the OS user). A --retry of a message that was ever unknown warns: the receiver may
already have applied it.

resolve --all settles every message of one destination in one state (finished since --since,
an RFC 3339 time or a duration ago like 2h) in one audited transaction, and prints the count.
replay re-sends, under the same dedupe keys, what a destination's messages finished since --since
(delivered by default, or --state failed): for a receiver that lost what it acknowledged or
refused while broken. A receiver that does not dedupe by webhook-id applies a replayed message it
still has twice.
`

func runDeliveries(ctx context.Context, args []string) error {
	return deliveries(ctx, args, os.Stdout)
}

func deliveries(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "resolve" && args[0] != "replay") {
		fmt.Fprint(os.Stderr, deliveriesUsage)
		return &exitError{2, errors.New("missing action: list, resolve or replay")}
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
	var delivered, failed, retry, all bool
	var operator, since string
	switch action {
	case "list":
		fs.StringVar(&f.State, "state", "", "only this state: waiting, reserved, retrying, delivered, failed, skipped or unknown")
		fs.IntVar(&f.Limit, "limit", 100, "rows at most, oldest first")
	case "resolve":
		fs.BoolVar(&delivered, "delivered", false, "the receiver has it")
		fs.BoolVar(&failed, "failed", false, "give up on it")
		fs.BoolVar(&retry, "retry", false, "send it again under the same Idempotency-Key")
		fs.StringVar(&operator, "operator", "", "who acts, for the audit log (default: the OS user)")
		fs.BoolVar(&all, "all", false, "every message of --destination in --state (instead of one KEY)")
		fs.StringVar(&f.State, "state", "", "with --all: retrying, unknown, failed or skipped")
		fs.StringVar(&since, "since", "", "with --all: only messages finished since this RFC 3339 time or duration ago (2h)")
	case "replay":
		fs.StringVar(&f.State, "state", webhook.StateDelivered, "re-send the messages in this state: delivered or failed")
		fs.StringVar(&since, "since", "", "re-send the messages finished since this RFC 3339 time or duration ago (2h); required")
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
	var sinceTime time.Time
	if since != "" {
		var err error
		if sinceTime, err = parseSince(since, time.Now()); err != nil {
			return err
		}
	}
	if action == "replay" {
		switch {
		case f.Destination == "":
			return errors.New("destination: replay needs --destination")
		case since == "":
			return errors.New("since: replay needs --since (an RFC 3339 time or a duration ago like 2h)")
		}
	}
	if action == "resolve" {
		n := 0
		for v, on := range map[string]bool{webhook.ResolveDelivered: delivered, webhook.ResolveFailed: failed, webhook.ResolveRetry: retry} {
			if on {
				resolution = v
				n++
			}
		}
		switch {
		case all && key != "":
			return errors.New("resolve: give a KEY or --all, not both")
		case all && (f.State == "" || f.Destination == ""):
			return errors.New("resolve --all: needs --state and --destination (it settles every message they select)")
		case !all && (f.State != "" || since != ""):
			return errors.New("resolve: --state and --since select messages for --all: add --all, or give one KEY")
		case key == "" && !all:
			return errors.New("resolve: the message's dedupe key is required: outboxd deliveries resolve KEY --destination D ..., or --all with --state")
		case f.Destination == "":
			return errors.New("destination: resolve needs --destination")
		case n != 1:
			return errors.New("resolve: give exactly one of --delivered, --failed or --retry")
		}
	}
	if action != "list" {
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

	if action == "replay" || all {
		sel := webhook.Selection{Destination: f.Destination, State: f.State, Since: sinceTime}
		var res webhook.BulkResult
		if action == "replay" {
			res, err = webhook.Replay(ctx, pool, db.schema, sel, operator)
		} else {
			res, err = webhook.ResolveAll(ctx, pool, db.schema, sel, resolution, operator)
		}
		if err != nil {
			return err
		}
		for _, w := range res.Warnings {
			fmt.Fprintln(os.Stderr, "warning:", w)
		}
		if *asJSON {
			return indentJSON(out, res)
		}
		done := "replayed"
		if action == "resolve" {
			done = "resolved " + resolution
		}
		fmt.Fprintf(out, "%d %s messages for %s %s by %s (recorded in audit_log)\n", res.Count, sel.State, sel.Destination, done, operator)
		return nil
	}
	if action == "resolve" {
		// A reserved message is settled by hand only when no relay leads
		// its destination's stream: one that does will finish it itself.
		resolve := webhook.Resolve
		leaders, err := relay.Leaders(ctx, pool, db.schema, []string{messageStream(f.Destination)})
		if err != nil {
			return err
		}
		if len(leaders) == 1 && leaders[0].PID == 0 {
			resolve = webhook.ResolveAbandoned
		}
		d, err := resolve(ctx, pool, db.schema, f.Destination, key, resolution, operator)
		if err != nil {
			return err
		}
		if d.Warning != "" {
			fmt.Fprintln(os.Stderr, "warning:", d.Warning)
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
	fmt.Fprintln(w, "DESTINATION\tKEY\tSTATE\tATTEMPTS\tHTTP\tDUPLICATES\tRESERVED\tNEXT ATTEMPT\tLAST ERROR")
	for _, d := range ds {
		code, next := "-", "-"
		if d.LastStatus != nil {
			code = fmt.Sprint(*d.LastStatus)
		}
		if d.NextAttemptAt != nil {
			next = d.NextAttemptAt.UTC().Format("2006-01-02 15:04:05")
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", d.Destination, d.DedupeKey, d.State, d.Attempts, code, d.Duplicates,
			d.ReservedAt.UTC().Format("2006-01-02 15:04:05"), next, clipLine(d.LastError, 80))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(ds) == f.Limit {
		fmt.Fprintf(out, "(first %d rows; more may follow: raise --limit or filter)\n", f.Limit)
	}
	return nil
}

// parseSince reads --since: an RFC 3339 time, or a duration before now.
func parseSince(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("since: %q is neither an RFC 3339 time (2026-12-01T10:00:00Z) nor a positive duration (2h)", v)
}
