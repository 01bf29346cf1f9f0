package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema"
)

func init() {
	register("status", "backlog, lag, leaders and dead letters at a glance; exit 2 when lagging past --max-age", runStatus)
}

func runStatus(ctx context.Context, args []string) error { return status(ctx, args, os.Stdout) }

// statusReport is `status --json`: the relay's Stats plus the verdict.
type statusReport struct {
	*relay.Stats
	OldestBacklogAge float64 `json:"oldest_backlog_age_seconds"`
	MaxAge           float64 `json:"max_age_seconds"` // 0: no threshold
	OK               bool    `json:"ok"`
}

func status(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: outboxd status [--json] [--max-age 5m]\n\nShows each stream's backlog, oldest unacknowledged event, leader and position, and the parked\ndead letters per index. Exits 2 when the oldest unacknowledged event is older than --max-age\n(for cron jobs and health checks), 1 on errors, 0 otherwise.\n\nFlags:")
		fs.PrintDefaults()
	}
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	maxAge := fs.Duration("max-age", 5*time.Minute, "exit 2 when the oldest unacknowledged event is older than this; 0 disables (or $OUTBOXD_STATUS_MAX_AGE)")
	abandonedAfter := fs.Duration("abandoned-after", relay.DefaultAbandonedAfter, "flag a stream as abandoned when it has no leader and no progress for this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (status takes only flags)", fs.Arg(0))
	}
	if *abandonedAfter <= 0 {
		return fmt.Errorf("abandoned-after: must be > 0, got %v", *abandonedAfter)
	}
	if *maxAge < 0 {
		return fmt.Errorf("max-age: must be >= 0, got %v", *maxAge)
	}
	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := relay.CollectStats(ctx, pool, db.schema)
	if err != nil {
		return err
	}
	st.MarkAbandoned(*abandonedAfter)
	oldest := st.OldestBacklogAge()
	if len(st.Streams) == 0 {
		// No relay has stored progress yet, so every event is pending.
		if oldest, err = oldestEvent(ctx, pool, db.schema); err != nil {
			return err
		}
	}
	lagging := *maxAge > 0 && oldest > *maxAge
	if *asJSON {
		if err := indentJSON(out, statusReport{Stats: st, OldestBacklogAge: oldest.Seconds(), MaxAge: maxAge.Seconds(), OK: !lagging}); err != nil {
			return err
		}
	} else {
		printStatus(out, db.schema, st)
	}
	if lagging {
		return &exitError{2, fmt.Errorf("lagging: the oldest unacknowledged event is %v old, over --max-age %v", oldest.Round(time.Second), *maxAge)}
	}
	return nil
}

// oldestEvent is the age of the outbox's first event (by id: close
// enough, and cheap through the primary key); 0 when it is empty.
func oldestEvent(ctx context.Context, db outbox.DB, schemaName string) (time.Duration, error) {
	id, err := schema.Ident(schemaName)
	if err != nil {
		return 0, err
	}
	var age float64
	err = db.QueryRow(ctx, `SELECT coalesce((SELECT extract(epoch FROM now() - created_at)::float8 FROM `+id+`.events ORDER BY id LIMIT 1), 0)`).Scan(&age)
	if err != nil {
		return 0, fmt.Errorf("oldest event: %w", err)
	}
	return time.Duration(age * float64(time.Second)), nil
}

func printStatus(out io.Writer, schemaName string, st *relay.Stats) {
	fmt.Fprintf(out, "outbox %q at %s\n\n", schemaName, st.TakenAt.Format(time.RFC3339))
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tBUCKETS\tBACKLOG\tOLDEST\tLEADER\tPOSITION AGE\tACKNOWLEDGED")
	if len(st.Streams) == 0 {
		fmt.Fprintln(tw, "(no stream has stored progress yet: is a relay running?)")
	}
	for _, s := range st.Streams {
		leader := "NONE"
		switch {
		case s.LeaderPID != 0:
			leader = fmt.Sprintf("pid %d %s", s.LeaderPID, s.LeaderClient)
		case s.Abandoned:
			leader = "NONE (ABANDONED)"
		}
		fmt.Fprintf(tw, "%s\t%d-%d\t%d\t%s\t%s\t%s\t%d\n", s.Stream, s.BucketLo, s.BucketHi, s.Backlog,
			humanSeconds(s.OldestAge), leader, humanSeconds(s.ProgressStale), s.Acknowledged)
	}
	tw.Flush()
	if ab := st.AbandonedStreams(); len(ab) > 0 {
		fmt.Fprintf(out, "\nabandoned streams hold retention back: %s\n(drop each with `outboxd streams drop NAME` once no relay is configured with it)\n", strings.Join(ab, ", "))
	}

	fmt.Fprintln(out, "\nDEAD LETTERS (parked)")
	tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	if len(st.DeadLetters) == 0 {
		fmt.Fprintln(tw, "none")
	} else {
		fmt.Fprintln(tw, "INDEX\tPARKED\tLAST REASON")
	}
	for _, d := range st.DeadLetters {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", d.Index, d.Parked, clipLine(d.LastReason, 100))
	}
	tw.Flush()
	fmt.Fprintf(out, "\nretained events: ~%d\n", st.Events)
}

func humanSeconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(100 * time.Millisecond).String()
}

func clipLine(s string, n int) string {
	r := []rune(s)
	for i, c := range r {
		if c == '\n' || c == '\r' || c == '\t' {
			r[i] = ' '
		}
	}
	if len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return string(r)
}
