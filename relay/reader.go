package relay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/outbox"
)

// Stream is one independently acknowledged share of the outbox: a range of
// source_id hash buckets (0..1023) and, optionally, a set of index names.
// Every version of one source falls in one bucket, so one stream sees all
// of a source's events in commit order.
//
// Indexes and Exclude take index names, or prefixes ending in "*": a
// stream reads the events whose index matches Indexes (all when empty)
// and no entry of Exclude. Streams with their own Sink can so split the
// outbox by destination, each acknowledged on its own: a slow sink holds
// back only its own stream.
type Stream struct {
	Name     string
	BucketLo int // inclusive, 0..1023
	BucketHi int // inclusive, 0..1023
	Indexes  []string
	Exclude  []string
	Sink     Sink // nil: Config.Sink
	// MaxPollInterval is this stream's longest idle wait; zero takes
	// Config.MaxPollInterval. A stream whose events nobody waits for (the
	// messages of destinations no relay serves, which are only recorded
	// as waiting) can poll less often when idle: every poll is a query.
	MaxPollInterval time.Duration
	// MaxBatchBytes is this stream's approximate bytes per page; zero
	// takes Config.MaxBatchBytes. A stream whose sink does little with a
	// page (the unrouted message stream only records its messages as
	// waiting) reads smaller pages: every page read ahead or at the sink
	// is memory the process holds.
	MaxBatchBytes int
	// NoLinger keeps this stream's pages from lingering (Config.Linger):
	// a sink that sends each event on its own, such as a webhook
	// destination's, gains nothing from larger writes, while its
	// receivers would wait up to Linger for every message.
	NoLinger bool
}

// likePatterns turns index names and "prefix*" entries into LIKE patterns.
func likePatterns(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		prefix, wild := strings.CutSuffix(n, "*")
		p := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(prefix)
		if wild {
			p += "%"
		}
		out[i] = p
	}
	return out
}

// Partitions splits the outbox into n streams by bucket range, named
// "<prefix>-<i>-of-<n>".
func Partitions(prefix string, n int) ([]Stream, error) {
	if n < 1 || n > 1024 {
		return nil, fmt.Errorf("relay: partitions: must be 1..1024, got %d", n)
	}
	if n == 1 {
		return []Stream{{Name: prefix, BucketLo: 0, BucketHi: 1023}}, nil
	}
	out := make([]Stream, n)
	for i := range n {
		out[i] = Stream{
			Name:     fmt.Sprintf("%s-%d-of-%d", prefix, i, n),
			BucketLo: i * 1024 / n,
			BucketHi: (i+1)*1024/n - 1,
		}
	}
	return out, nil
}

// position is a stream's acknowledgement boundary: every event visible in
// done is handled, and so is every event of the batch (visible in batch,
// not in done) at or before (cursorXID, cursorID) in (xid, id) order.
type position struct {
	done      Snapshot
	batch     *Snapshot
	cursorXID uint64
	cursorID  int64
}

func (p position) equal(o position) bool {
	if !p.done.Equal(o.done) || (p.batch == nil) != (o.batch == nil) {
		return false
	}
	if p.batch != nil && !p.batch.Equal(*o.batch) {
		return false
	}
	return p.cursorXID == o.cursorXID && p.cursorID == o.cursorID
}

// page is one read: events in (xid, id) order and the position reached
// once all of them are handled.
type page struct {
	events []outbox.Event
	bytes  int
	pos    position
	err    error // a read failure the stream cannot go on from
}

// reader reads a stream's committed events in snapshot batches, PgQ style:
// a batch is what became visible between two snapshots. A transaction that
// commits late is in the earlier snapshot's in-progress list and is picked
// up by the batch in which it becomes visible, so nothing is skipped; and an
// unrelated long transaction only adds one cheap lookup of its xid per
// batch instead of holding back everything behind it.
type reader struct {
	pool     *pgxpool.Pool
	schema   string // quoted
	stream   Stream
	maxDocs  int
	maxBytes int
	pos      position
	avgSize  int // bytes per event of the last page read; 0 before the first
	// lastEvents is how many events the last page read held: the next
	// page's first allocation (a backlog's pages are full, a trickle's
	// hold a few).
	lastEvents int
	// ledFrom is the transaction counter of the stored position this
	// leadership started from: a position beyond it was read by this
	// leader, not stored (see serverChangedError).
	ledFrom uint64
	// afterRead, set by tests only (Config.afterRead), sees the position
	// after each successful read.
	afterRead func(*position, int)
	// lock, when set, is checked by reads now and then on the leader's
	// behalf (see lockCheck).
	lock *lockCheck
}

// limit is the page query's LIMIT: maxDocs, or fewer when the events seen
// so far say maxBytes is reached sooner. The server sends every row up to
// the LIMIT, and rows past a byte-capped page's end are read only to be
// thrown away: with 10 kB documents that was most of what a backlog drain
// moved over the wire.
func (r *reader) limit() int {
	if r.avgSize <= 0 {
		return r.maxDocs
	}
	// A quarter of slack so that most pages still end by bytes.
	return max(1, min(r.maxDocs, r.maxBytes/r.avgSize*5/4+1))
}

const eventColumns = `id, xid, index_name, source_id, version, op, document, coalesce(event_type, ''), headers, occurred_at, created_at`

// filter returns the stream's extra WHERE terms, numbering parameters from
// next: all of them, and the same without the message index's predicate
// for the page query's late-committer branch (see pageSQL).
func (r *reader) filter(next int) (all, late string, args []any) {
	var head, tail string
	if r.stream.BucketLo > 0 || r.stream.BucketHi < 1023 {
		head = fmt.Sprintf(" AND bucket BETWEEN $%d AND $%d", next, next+1)
		args = append(args, int16(r.stream.BucketLo), int16(r.stream.BucketHi))
		next += 2
	}
	var messages string
	if len(r.stream.Indexes) > 0 {
		var p string
		p, messages = indexPredicate(r.stream.Indexes)
		head += " AND " + p
	}
	if len(r.stream.Exclude) > 0 {
		tail = fmt.Sprintf(" AND NOT index_name LIKE ANY($%d)", next)
		args = append(args, likePatterns(r.stream.Exclude))
	}
	return head + messages + tail, head + tail, args
}

// indexPredicate selects a stream's indexes in a form the planner can
// match to an index: literals, not parameters (a generic plan cannot tell
// a rare index name from a common one), and equality for exact names. For
// a stream of messages it also returns the message index's own predicate,
// which lets the planner use that index, so that the read costs in
// proportion to the stream's events, not the outbox's.
func indexPredicate(names []string) (p, messageIndex string) {
	exact, messages := true, true
	quoted := make([]string, len(names))
	for i, n := range names {
		exact = exact && !strings.HasSuffix(n, "*")
		messages = messages && strings.HasPrefix(n, outbox.MessagePrefix)
		quoted[i] = sqlString(n)
	}
	switch {
	case exact && len(names) == 1:
		p = "index_name = " + quoted[0]
	case exact:
		p = "index_name IN (" + strings.Join(quoted, ", ") + ")"
	default:
		pats := likePatterns(names)
		for i := range pats {
			pats[i] = sqlString(pats[i])
		}
		p = "index_name LIKE ANY (ARRAY[" + strings.Join(pats, ", ") + "])"
	}
	if messages {
		// The predicate of the events_messages index, word for word.
		messageIndex = " AND index_name LIKE '" + outbox.MessagePrefix + "%'"
	}
	return p, messageIndex
}

// sqlString quotes s as an SQL string literal; one with a backslash (a
// LIKE escape) as an E” literal, which means the same whatever
// standard_conforming_strings says.
func sqlString(s string) string {
	q := strings.ReplaceAll(s, "'", "''")
	if strings.Contains(s, `\`) {
		return "E'" + strings.ReplaceAll(q, `\`, `\\`) + "'"
	}
	return "'" + q + "'"
}

// pageSQL reads the next events of a batch after from: those visible in
// the batch, not in done, after the cursor in (xid, id) order. Without an
// explicit batch snapshot, the statement's own snapshot is the batch's
// upper bound. Three branches, each of which the (xid, id) index starts
// at its first row:
//  1. the rest of the cursor's own transaction (the cursor is an event of
//     the batch, or none at its start; the branch checks against done all
//     the same, so that it depends on the snapshots alone);
//  2. the late committers after it: in progress in done, visible now;
//  3. the transactions begun after done and after the cursor's.
//
// The statement runs on its generic plan (see orderedScan), so each
// branch is written for the one index scan that suits it whatever the
// parameters. The first says (xid, id) > cursor AND xid <= cursor: the
// row comparison is where the scan starts, at the cursor. With xid =
// cursor beside it the scan started at the first row of the cursor's
// transaction and stepped over every row read before (one transaction of
// 1,000,000 events cost 14 ms more per page at its middle, quadratic time
// in all), and written as id > cursor the generic plan scans the primary
// key from the cursor's id. The second looks the late committers' xids up
// in the (xid, id) index, and only those that have finished: a
// transaction still in progress is skipped before the scan, which
// otherwise stepped over every row it had written so far on every poll
// (19.6 ms and 4,054 buffers a poll beside an open transaction of 200,000
// events); the xids it keeps are visible, so its rows need no check of
// their own. It goes without the message index's predicate: on that
// index, whose first column is the index name, xid = ANY(...) is a filter,
// and a poll walked every retained message of the destination.
// Parameters: $1 done's in-progress xids, $2 $3 the cursor, $4 the page
// size, $5 where the third branch starts, then the stream filter, the
// batch snapshot and done.
func (r *reader) pageSQL(from position, batch *Snapshot) (string, []any) {
	f, late, fargs := r.filter(6)
	after := max(from.done.Xmax, from.cursorXID+1)
	args := append([]any{from.done.Xip, from.cursorXID, from.cursorID, r.limit(), after}, fargs...)
	upper := "pg_current_snapshot()"
	if batch != nil {
		args = append(args, batch.String())
		upper = fmt.Sprintf("$%d::pg_snapshot", len(args))
	}
	args = append(args, from.done.String())
	done := fmt.Sprintf("$%d::pg_snapshot", len(args))
	visible := ` AND pg_visible_in_snapshot(xid, ` + upper + `)`
	end := `
    ORDER BY xid, id LIMIT $4)`
	// Each branch selects the page's columns itself: selecting * into a
	// subquery and the columns out of it added a subquery scan per branch
	// and a projection over the merge, a third of the statement's
	// executor time for a page of 4,000 small events.
	events := ` FROM ` + r.schema + `.events`
	sql := `(SELECT ` + eventColumns + events + `
    WHERE (xid, id) > ($2::xid8, $3::bigint) AND xid <= $2::xid8 AND NOT pg_visible_in_snapshot(xid, ` + done + `)` + visible + f + end + `
  UNION ALL
  (SELECT ` + eventColumns + events + `
    WHERE xid = ANY(ARRAY(SELECT x FROM unnest($1::xid8[]) AS x WHERE pg_visible_in_snapshot(x, ` + upper + `))) AND xid > $2::xid8` + late + end + `
  UNION ALL
  (SELECT ` + eventColumns + events + `
    WHERE xid >= $5::xid8 AND xid < pg_snapshot_xmax(` + upper + `)` + visible + f + end + `
  ORDER BY xid, id LIMIT $4`
	return sql, args
}

// next reads one page and advances the reader's own position (not the
// stream's acknowledged one: the writer persists that after the sink).
//
// The position moves only once the whole read has succeeded, rows and the
// end of the statement or transaction included: a read that fails at any
// point leaves r.pos where it was, so the retry reads the same events
// again. Moving it earlier skipped a page whose COMMIT answer was lost.
func (r *reader) next(ctx context.Context) (page, error) {
	if r.pos.batch == nil {
		return r.nextBatch(ctx)
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	defer conn.Release()
	sql, args := r.pageSQL(r.pos, r.pos.batch)
	b := &pgx.Batch{}
	b.Queue(`BEGIN READ ONLY`)
	check := r.lock.queueIfDue(b)
	queuePage(b, sql, args)
	b.Queue(`COMMIT`)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil { // BEGIN
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	if err := check(br); err != nil {
		return page{}, fmt.Errorf("relay: check the stream's lock: %w", err)
	}
	return r.finishPage(br, r.pos)
}

// orderedScan keeps a page query on the (xid, id) index order, which its
// LIMIT stops after a page's rows, and plans it once per connection. The
// planner estimates a transaction's rows from statistics taken before it
// committed: for one transaction of 300,000 events it expected 238 rows,
// and chose a bitmap scan of every remaining row of the transaction plus a
// sort, for every page of it. A large transaction then cost time quadratic
// in its size (137 ms per 8,000-event page at 300,000, against 7 ms in
// index order). With bitmap and sequential scans off, every branch of the
// query has one sensible plan, an index scan that its LIMIT stops, whatever
// the parameters: so the statement takes the generic plan, not a custom
// plan per read. Planning the three branches cost 0.36-0.40 ms of server
// CPU per read, ten times the executor's time for an empty or small page:
// at 500 events/s, most of what a read cost the server. The settings end
// with the read's transaction.
const orderedScan = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true),
    set_config('plan_cache_mode', 'force_generic_plan', true)`

// queuePage queues a page query behind the settings that keep it on its
// generic plan in index order; the caller has queued BEGIN.
func queuePage(b *pgx.Batch, sql string, args []any) {
	b.Queue(orderedScan)
	b.Queue(sql, args...)
}

// finishPage reads what queuePage and COMMIT answer: the settings, the
// page's rows from `from`, and COMMIT. The page counts as read, and the
// reader's position moves, only with COMMIT's answer and the end of the
// pipeline in hand: until then the connection may still fail, and the
// caller would drop the page while the position went past it.
func (r *reader) finishPage(br pgx.BatchResults, from position) (page, error) {
	if _, err := br.Exec(); err != nil { // the plan settings
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	p, err := r.collect(rows, from)
	if err != nil {
		return page{}, err
	}
	if _, err := br.Exec(); err != nil {
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	if err := br.Close(); err != nil {
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	r.advance(p)
	return p, nil
}

// nextBatch takes a new snapshot and reads the first page under it, in one
// repeatable-read transaction so the page and the snapshot agree. The page
// query depends only on done, not on the new snapshot (the statement's own
// snapshot bounds the batch), so the whole transaction goes to the server
// as one pipeline: an idle poll costs one round trip, not four.
func (r *reader) nextBatch(ctx context.Context) (page, error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	// A pipeline cut short by an error leaves its transaction open; the
	// pool closes such a connection on release rather than reuse it.
	defer conn.Release()
	from := position{done: r.pos.done} // a new batch starts at no cursor
	sql, args := r.pageSQL(from, nil)
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`)
	b.Queue(`SELECT pg_current_snapshot()::text`)
	check := r.lock.queueIfDue(b)
	queuePage(b, sql, args)
	b.Queue(`COMMIT`)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	var text string
	if err := br.QueryRow().Scan(&text); err != nil {
		return page{}, fmt.Errorf("relay: take snapshot: %w", err)
	}
	if err := check(br); err != nil {
		return page{}, fmt.Errorf("relay: check the stream's lock: %w", err)
	}
	snap, err := ParseSnapshot(text)
	if err != nil {
		return page{}, err
	}
	if snap.Xmax < from.done.Xmax && from.done.Xmax > r.ledFrom {
		// The counter is behind a position this leader read but has not
		// necessarily stored: the pool now reaches another server than
		// the one it read from (a standby promoted without the newest
		// transactions). That server's stored position is the truth.
		return page{}, &serverChangedError{Stream: r.stream.Name, Counter: snap.Xmax, Read: from.done.Xmax}
	}
	if snap.Xmax < from.done.Xmax {
		// xid8 never goes backwards in one cluster; it does after a dump
		// and restore into another. Guessing would skip or replay events.
		return page{}, &PositionError{Stream: r.stream.Name, Reason: fmt.Sprintf(
			"the database's transaction counter (%d) is behind the stored position (%d): was it restored or replaced? Reset the stream's progress deliberately", snap.Xmax, from.done.Xmax)}
	}
	if snap.Xmax == from.done.Xmax && len(finishedSince(from.done, snap)) == 0 {
		// Nothing has committed since done: the page read is empty, and
		// the position stays.
		return page{pos: r.pos}, nil
	}
	from.batch = &snap
	return r.finishPage(br, from)
}

// collect reads a page's rows and computes, without moving r.pos, the
// position reached from `from` (whose batch is the one being read) once
// they are handled.
func (r *reader) collect(rows pgx.Rows, from position) (page, error) {
	defer rows.Close()
	var p page
	full := false
	limit := r.limit()
	dec := newRowDecoder(rows.FieldDescriptions(), rows.Conn().TypeMap())
	for rows.Next() {
		if p.events == nil {
			// Allocated on the first row (idle polls find none), as large
			// as the last page: at a low rate pages hold a few events, and
			// zeroing a full page's worth of Event structs for each cost
			// more than the rest of the read; in a backlog every page is
			// full, and growing one from a few events copied each event
			// about twice (a fifth of a drain's CPU).
			p.events = make([]outbox.Event, 0, min(limit, max(64, r.lastEvents)))
		}
		p.events = append(p.events, outbox.Event{})
		e := &p.events[len(p.events)-1]
		if !dec.decode(rows.RawValues(), e) {
			if err := rows.Scan(&e.ID, &e.XID, &e.IndexName, &e.SourceID, &e.Version, (*string)(&e.Op), (*[]byte)(&e.Document),
				&e.EventType, (*[]byte)(&e.Headers), &e.OccurredAt, &e.CreatedAt); err != nil {
				return page{}, fmt.Errorf("relay: read events: %w", err)
			}
		}
		p.bytes += e.Size()
		if len(p.events) >= limit || p.bytes >= r.maxBytes {
			// A byte-capped page stops early; the cursor marks where.
			full = true
			break
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return page{}, fmt.Errorf("relay: read events: %w", err)
	}
	p.pos = from
	if n := len(p.events); n > 0 {
		p.pos.cursorXID, p.pos.cursorID = p.events[n-1].XID, p.events[n-1].ID
	}
	if !full {
		// The batch is exhausted: everything visible in it is read.
		p.pos = position{done: *from.batch}
	}
	return p, nil
}

// advance takes the position of a page whose read fully succeeded.
func (r *reader) advance(p page) {
	r.pos = p.pos
	r.lastEvents = len(p.events)
	if n := len(p.events); n > 0 {
		r.avgSize = max(1, p.bytes/n)
	}
	if r.afterRead != nil {
		r.afterRead(&r.pos, len(p.events))
	}
}

// serverChangedError means the database's transaction counter is behind a
// position the stream's leader read (not the one it was given): the reads
// now reach another server than before, a failover to a standby that
// lacks the old primary's newest transactions. The leader gives the
// stream up and leads it again from the position stored on the server it
// now reaches; reading on from the position in memory could take
// transaction ids that server hands out again for done, and skip their
// events. It is not a reason to stop (see PositionError for a stored
// position that is ahead).
type serverChangedError struct {
	Stream  string
	Counter uint64 // the database's transaction counter now
	Read    uint64 // the counter of the position the leader read
}

func (e *serverChangedError) Error() string {
	return fmt.Sprintf("relay: stream %s: the database's transaction counter (%d) is behind the position this leader read (%d): another server (a promoted standby?) answers now; leading again from its stored position", e.Stream, e.Counter, e.Read)
}
