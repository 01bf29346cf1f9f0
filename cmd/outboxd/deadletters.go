package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/relay"
)

func init() {
	register("deadletters", "list, show, retry or discard parked events (every action is audited)", runDeadLetters)
}

const deadLettersUsage = `Usage:
  outboxd deadletters list    [--index I] [--status parked|retried|discarded|all] [--reason TEXT] [--source-id S] [--limit 50] [--after ID] [--json]
  outboxd deadletters show    --id N[,N...] [--json]
  outboxd deadletters retry   (--id N[,N...] | --index I | --source-id S | --reason TEXT | --all) [--operator NAME] [--json]
  outboxd deadletters discard (--id N[,N...] | --index I | --source-id S | --reason TEXT | --all) [--operator NAME] [--json]

retry re-queues each parked dead letter as a new outbox event (same index, source id, version,
op, document, headers), so the relay delivers it through the normal path and the index's version
check still applies. discard gives up on them. Both act only on parked dead letters, in one
transaction, and write an audit_log row with the operator (--operator, default the OS user).
`

func runDeadLetters(ctx context.Context, args []string) error {
	return deadLetters(ctx, args, os.Stdout)
}

func deadLetters(ctx context.Context, args []string, out io.Writer) error {
	a, err := parseDeadLetters(args)
	if err != nil {
		return err
	}
	pool, err := a.db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch a.action {
	case "list":
		return listDeadLetters(ctx, pool, a, out)
	case "show":
		return showDeadLetters(ctx, pool, a, out)
	}
	return resolveDeadLetters(ctx, pool, a, out)
}

// dlArgs is a checked deadletters command line.
type dlArgs struct {
	action   string // list, show, retry or discard
	db       *dbFlags
	f        relay.DeadLetterFilter
	asJSON   bool
	operator string // retry and discard
}

func parseDeadLetters(args []string) (*dlArgs, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(os.Stderr, deadLettersUsage)
		return nil, &exitError{2, errors.New("missing action: list, show, retry or discard")}
	}
	a := &dlArgs{action: args[0]}
	action, args := args[0], args[1:]
	switch action {
	case "list", "show", "retry", "discard":
	default:
		fmt.Fprint(os.Stderr, deadLettersUsage)
		return nil, &exitError{2, fmt.Errorf("unknown action %q: want list, show, retry or discard", action)}
	}

	fs := flag.NewFlagSet("deadletters "+action, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), deadLettersUsage+"\nFlags:\n")
		fs.PrintDefaults()
	}
	a.db = addDBFlags(fs)
	var ids idList
	f := &a.f
	fs.BoolVar(&a.asJSON, "json", false, "print JSON")
	fs.Var(&ids, "id", "dead letter id; repeat the flag or separate with commas")
	fs.StringVar(&f.Index, "index", "", "only dead letters of this index")
	fs.StringVar(&f.SourceID, "source-id", "", "only dead letters of this source id")
	fs.StringVar(&f.ReasonContains, "reason", "", "only dead letters whose reason contains this text (any case)")
	fs.StringVar(&f.Kind, "kind", "", "only dead letters of this kind: rejected (the index refused the event) or gave_up (transient failures past the attempt limit)")
	status := "parked"
	switch action {
	case "list":
		fs.StringVar(&status, "status", "parked", "parked, retried, discarded or all")
		fs.IntVar(&f.Limit, "limit", 50, "rows per page")
		fs.Int64Var(&f.AfterID, "after", 0, "show dead letters with an id above this (the next page)")
	case "retry", "discard":
		fs.BoolVar(&f.All, "all", false, "act on every parked dead letter (required when no other selection is given)")
		fs.StringVar(&a.operator, "operator", "", "who acts, for the audit log (default: the OS user)")
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (use --id for ids)", fs.Arg(0))
	}
	f.IDs = ids
	switch status {
	case "all":
		f.Status = ""
	case relay.DeadLetterParked, relay.DeadLetterRetried, relay.DeadLetterDiscarded:
		f.Status = status
	default:
		return nil, fmt.Errorf("status: must be parked, retried, discarded or all, got %q", status)
	}
	if f.Kind != "" && f.Kind != relay.KindRejected && f.Kind != relay.KindGaveUp {
		return nil, fmt.Errorf("kind: must be %s or %s, got %q", relay.KindRejected, relay.KindGaveUp, f.Kind)
	}
	if action == "list" && f.Limit <= 0 {
		return nil, fmt.Errorf("limit: must be > 0, got %d", f.Limit)
	}
	if action == "show" && len(ids) == 0 {
		return nil, errors.New("id: show needs --id")
	}
	if (action == "retry" || action == "discard") && !f.All && len(ids) == 0 && f.Index == "" && f.SourceID == "" && f.ReasonContains == "" && f.Kind == "" {
		return nil, fmt.Errorf("%s: select dead letters with --id, --index, --source-id, --reason or --kind, or pass --all", action)
	}
	if action == "retry" || action == "discard" {
		var err error
		if a.operator, err = operatorName(a.operator); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func listDeadLetters(ctx context.Context, pool *pgxpool.Pool, a *dlArgs, out io.Writer) error {
	dls, err := relay.ListDeadLetters(ctx, pool, a.db.schema, a.f)
	if err != nil {
		return err
	}
	if a.asJSON {
		return indentJSON(out, dls)
	}
	printDeadLetters(out, dls, a.f.Limit)
	return nil
}

func showDeadLetters(ctx context.Context, pool *pgxpool.Pool, a *dlArgs, out io.Writer) error {
	var dls []relay.DeadLetter
	for _, id := range a.f.IDs {
		d, err := relay.GetDeadLetter(ctx, pool, a.db.schema, id)
		if err != nil {
			return err
		}
		dls = append(dls, *d)
	}
	if a.asJSON {
		return indentJSON(out, dls)
	}
	for i, d := range dls {
		if i > 0 {
			fmt.Fprintln(out)
		}
		printDeadLetter(out, &d)
	}
	return nil
}

// resolveDeadLetters retries or discards the selected parked dead letters.
func resolveDeadLetters(ctx context.Context, pool *pgxpool.Pool, a *dlArgs, out io.Writer) error {
	var n int
	var err error
	if a.action == "retry" {
		n, err = relay.RetryDeadLetters(ctx, pool, a.db.schema, a.f, a.operator)
	} else {
		n, err = relay.DiscardDeadLetters(ctx, pool, a.db.schema, a.f, a.operator)
	}
	if err != nil {
		return err
	}
	if a.asJSON {
		return indentJSON(out, map[string]any{"action": a.action, "count": n, "operator": a.operator})
	}
	verb := "re-queued"
	if a.action == "discard" {
		verb = "discarded"
	}
	fmt.Fprintf(out, "%s %d dead letter(s) as %s (recorded in audit_log)\n", verb, n, a.operator)
	return nil
}

// operatorName is --operator, else the OS user: the audit log must say who.
func operatorName(flagValue string) (string, error) {
	if s := strings.TrimSpace(flagValue); s != "" {
		return s, nil
	}
	if s := os.Getenv("USER"); s != "" {
		return s, nil
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username, nil
	}
	return "", errors.New("operator: cannot tell who you are; pass --operator NAME")
}

// idList is a repeatable, comma-separated --id flag.
type idList []int64

func (l *idList) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(s, ",")
}

func (l *idList) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		n, err := strconv.ParseInt(part, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q is not a dead letter id (a positive integer)", part)
		}
		*l = append(*l, n)
	}
	return nil
}

func indentJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printDeadLetters(out io.Writer, dls []relay.DeadLetter, limit int) {
	if len(dls) == 0 {
		fmt.Fprintln(out, "no dead letters match")
		return
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tINDEX\tSOURCE ID\tVERSION\tOP\tSTATUS\tATTEMPTS\tLAST FAILED\tREASON")
	for _, d := range dls {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.Index, clipLine(d.SourceID, 40), d.Version, d.Op,
			d.Status, d.Attempts, d.LastFailedAt.Format(time.RFC3339), clipLine(d.Reason, 80))
	}
	tw.Flush()
	if len(dls) == limit {
		fmt.Fprintf(out, "\nmore may follow: --after %d\n", dls[len(dls)-1].ID)
	}
}

func printDeadLetter(out io.Writer, d *relay.DeadLetter) {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("id", d.ID)
	row("status", d.Status)
	if d.ResolvedAt != nil {
		row("resolved", d.ResolvedAt.Format(time.RFC3339)+" by "+d.ResolvedBy)
	}
	row("event id", d.EventID)
	row("stream", d.Stream)
	row("index", d.Index)
	row("source id", d.SourceID)
	row("version", d.Version)
	row("op", d.Op)
	if d.EventType != "" {
		row("event type", d.EventType)
	}
	row("occurred at", d.OccurredAt.Format(time.RFC3339))
	row("attempts", d.Attempts)
	row("first failed", d.FirstFailedAt.Format(time.RFC3339))
	row("last failed", d.LastFailedAt.Format(time.RFC3339))
	row("kind", d.Kind)
	row("reason", d.Reason)
	tw.Flush()
	if len(d.Headers) > 0 {
		fmt.Fprintf(out, "headers:\n  %s\n", d.Headers)
	}
	if len(d.Document) > 0 {
		fmt.Fprintf(out, "document:\n  %s\n", d.Document)
	}
}
