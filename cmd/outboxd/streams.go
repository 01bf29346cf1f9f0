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
)

func init() {
	register("streams", "list streams (flags abandoned ones) or drop one so retention can go on (audited)", runStreams)
}

const streamsUsage = `Usage:
  outboxd streams list [--abandoned-after 1h] [--json]
  outboxd streams drop NAME [--operator NAME] [--json]

A stream whose relays changed --partitions, --stream or --indexes is left behind: no relay
leads it, and retention keeps every event it has not acknowledged, so the outbox grows without
bound. list marks such a stream abandoned once it has had no leader and no progress for
--abandoned-after. drop deletes its progress row, so retention can delete the events; it
refuses a stream that a relay leads, and writes an audit_log row with the operator (--operator,
default the OS user).
`

func runStreams(ctx context.Context, args []string) error { return streams(ctx, args, os.Stdout) }

func streams(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(os.Stderr, streamsUsage)
		return &exitError{2, errors.New("missing action: list or drop")}
	}
	action, args := args[0], args[1:]
	if action != "list" && action != "drop" {
		fmt.Fprint(os.Stderr, streamsUsage)
		return &exitError{2, fmt.Errorf("unknown action %q: want list or drop", action)}
	}
	fs := flag.NewFlagSet("streams "+action, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), streamsUsage+"\nFlags:\n")
		fs.PrintDefaults()
	}
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	after := relay.DefaultAbandonedAfter
	operator := ""
	var name string
	if action == "list" {
		fs.DurationVar(&after, "abandoned-after", relay.DefaultAbandonedAfter, "a stream with no leader and no progress for this long is abandoned")
	} else {
		fs.StringVar(&operator, "operator", "", "who acts, for the audit log (default: the OS user)")
		// The name comes first, as in the usage line; flags may follow it.
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			name, args = args[0], args[1:]
		}
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if action == "drop" && name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if after <= 0 {
		return fmt.Errorf("abandoned-after: must be > 0, got %v", after)
	}
	if action == "drop" {
		if name == "" {
			return errors.New("name: drop needs the stream's name (see `outboxd streams list`)")
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

	if action == "list" {
		list, err := relay.ListStreams(ctx, pool, db.schema, after)
		if err != nil {
			return err
		}
		if *asJSON {
			if list == nil {
				list = []relay.StreamInfo{}
			}
			return indentJSON(out, list)
		}
		printStreams(out, list)
		return nil
	}
	if err := relay.DropStream(ctx, pool, db.schema, name, operator); err != nil {
		return err
	}
	if *asJSON {
		return indentJSON(out, map[string]any{"action": "drop", "stream": name, "operator": operator})
	}
	fmt.Fprintf(out, "dropped stream %s as %s (recorded in audit_log); retention no longer waits for it\n", name, operator)
	return nil
}

func printStreams(out io.Writer, list []relay.StreamInfo) {
	if len(list) == 0 {
		fmt.Fprintln(out, "no stream has stored progress yet: is a relay running?")
		return
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tBUCKETS\tINDEXES\tPOSITION\tLAST PROGRESS\tLEADER\tSTATE")
	for _, s := range list {
		leader, state := "none", "not led"
		switch {
		case s.LeaderPID != 0:
			leader, state = fmt.Sprintf("pid %d %s", s.LeaderPID, s.LeaderClient), "led"
		case s.Abandoned:
			state = "ABANDONED"
		}
		indexes := "all"
		if len(s.Indexes) > 0 {
			indexes = strings.Join(s.Indexes, ",")
		}
		fmt.Fprintf(tw, "%s\t%d-%d\t%s\t%s\t%s (%s ago)\t%s\t%s\n", s.Name, s.BucketLo, s.BucketHi, indexes, s.Position,
			s.UpdatedAt.Format(time.RFC3339), humanSeconds(s.ProgressAge), leader, state)
	}
	tw.Flush()
	for _, s := range list {
		if s.Abandoned {
			fmt.Fprintln(out, "\nabandoned streams hold retention back: drop each with `outboxd streams drop NAME` once no relay is configured with it")
			break
		}
	}
}
