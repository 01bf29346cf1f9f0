// Package relay is the outbox engine: it streams every committed event
// (appended with package outbox, or the SQL function <schema>.append) to
// a Sink exactly in step with PostgreSQL's commits, acknowledges pages in
// reading order, parks what the sink refuses in dead letters, and shares
// the streams among relays by leadership. It depends on outbox and schema,
// never on a sink.
//
// # Reading without gaps
//
// Event ids (and xids) are assigned before commit, and transactions commit
// out of that order: a reader that pages by "id > last" skips a transaction
// that commits after a later one forever. The known fixes were weighed:
//
//   - an xid watermark (read only below the oldest running transaction)
//     stalls all delivery behind any long write transaction in the cluster;
//   - claim-and-mark with FOR UPDATE SKIP LOCKED costs an UPDATE and a dead
//     tuple per event, and the WAL that goes with them;
//   - logical decoding needs wal_level=logical and a slot that retains WAL
//     without bound while the relay is down.
//
// The relay uses PgQ-style snapshot batches instead. Each event row stores
// its writer's xid8. A stream's position is a snapshot "done": every
// transaction visible in it is handled. The next batch is what is visible
// in a new snapshot and not in done: transactions that started after
// done.xmax plus those in done's in-progress list that have since
// finished. A late committer is in that list and is picked up by the first
// batch in which it is visible; an unrelated long transaction costs one
// index lookup of its xid per batch and stalls nothing. Reading is a range
// scan of the (xid, id) index that starts at the page's first row, so a
// page costs its own rows wherever it falls, in the middle of a
// transaction of a million events too; the relay writes nothing per event,
// only one progress row per page.
//
// # Acknowledgement
//
// Progress is an acknowledgement boundary. A batch is delivered in pages in
// (xid, id) order; once the sink has given every event of a page, and of
// every page before it, a terminal outcome (applied, stale, or parked as a
// dead letter), the page's end may be stored as (done, batch snapshot,
// cursor) in the progress table, in the same transaction as its dead
// letters. Pages are acknowledged in reading order, never in completion
// order; stores are coalesced to one per Config.StoreInterval. A position
// moved only by empty pages is stored after Config.ProgressInterval when
// events of other streams went by (retention waits for every stream), and
// after Config.QuietProgressInterval when none did: every store is a
// transaction that moves the other streams' positions, and an idle relay's
// streams must not keep one another writing. A crash anywhere re-delivers what came
// after the stored position: delivery is at least once, so Sink.Write must
// be idempotent. A failure to store progress (a *ProgressError) is never
// swallowed: the stream is given up with its lock and led again from the
// stored position.
//
// A page read at a low rate lingers (Config.Linger) to
// gather what commits meanwhile, and goes as soon as it holds
// Config.LingerDocs events: the sink gets fewer, larger writes for at most
// Linger of added latency. While such a trickle lasts, the next read waits
// until the rate says LingerDocs events are there, within Linger of the
// previous page's hand-over, which counts toward its linger: one read per
// page instead of a poll that finds an event or two. A full page, and the
// page after it, never linger: a backlog is not held back; nor does a
// stream with Stream.NoLinger. A lingering page is not yet
// acknowledged, so a shutdown or crash during the linger re-delivers it.
//
// Pages are acknowledged in order, but up to Config.InFlight of them are at
// the sink at once, so a sink must not rely on order. Even with InFlight 1
// the events of one read (one snapshot) arrive in transaction-id order,
// and a transaction takes its id at its first write: two writers of one
// source that took their ids in one order and committed (and took their
// versions) in the other arrive with the later version first when both
// committed before the same read. Retries, replays and
// failovers re-deliver older events anyway. The versions carried by the events
// are what make the result exact (see package indexer).
//
// # Failures
//
// A Retry outcome is retried with exponential backoff and jitter, up to
// Config.MaxAttempts per event, then parked in dead_letters with the last
// reason. A Rejected outcome is parked at once. A Sink.Write error means the
// sink is unavailable as a whole: the page is retried without limit (and
// logged, and counted in outboxd_sink_errors_total) so an outage of minutes
// delays delivery but never dead-letters the backlog. A sink that also
// implements Prober is probed once a second during such an outage, and the
// page is retried as soon as it answers again rather than after a backoff
// grown to BackoffMax.
//
// A lost PostgreSQL session (a restart, a failover, pg_terminate_backend)
// is healed in place: the stream is given up, the relay reconnects with
// backoff, takes the lock again and resumes from the stored position (see
// heal.go). Run returns an error only for what reconnecting cannot fix.
//
// # Leadership and partitions
//
// Each stream has one leader: a session-level advisory lock on
// (schema, stream), held on the same connection that writes the stream's
// progress. If the leader dies its session ends, PostgreSQL releases the
// lock, and a standby polling every Config.LeaseInterval takes over from
// the stored position. A leader whose session is gone cannot store
// progress, so two relays never both advance a stream. A leader that
// stores nothing learns at least twice per LeaseInterval whether the
// server still holds the lock for that session: its reads ask, in their
// own round trip, which backend holds it (on which server), an answer of
// "not held" ends the leadership at once, and it pings the session only
// when no read answered within half an interval, or every ten intervals
// (a connection the network swallows while its backend lives passes every
// check; only a ping times out on it). So even an idle leader
// stops calling itself leader within one interval of losing it. Streams partition
// the outbox by 1024 hash buckets of source_id (Partitions).
// Streams also split the outbox by index name (Stream.Indexes and
// Stream.Exclude, with "prefix*" entries), each with its own Sink if it
// likes: outboxd gives every webhook destination a stream of its own and
// keeps the message namespace out of the Elasticsearch streams, so a slow
// receiver holds back nothing but its own messages. A Sink that also
// implements LeaderWork gets its Lead run for as long as the process leads
// the stream (a webhook sink retries its parked messages there); the
// stream is given up only once Lead has returned.
//
// # Balancing
//
// Live relays hold a shared advisory lock each and advertise the streams
// they can lead (<schema>.relays), and they may serve different streams
// (a rolling deploy that adds a destination adds a stream). Shares are
// counted per stream, from the relays that can lead it: a relay's share
// is its load in the most even split of every live relay's streams among
// the relays that can lead them, rounded up (with one configuration
// everywhere, ceil(streams / relays)). The contract (see balance.go):
//
//   - no stream stays unled while a live relay can lead it: a relay with
//     room stands by for it (a shared standby lock on its connection) and
//     takes it; one without room takes a stream nobody leads or stands by
//     for after a lease interval, beyond its share;
//   - a stream only one live relay can lead is always led by it and never
//     handed away;
//   - a relay above its share hands a stream only to a standby, one per
//     lease interval, so nobody takes a stream back and no two relays
//     fight over one; once the fleet is steady no relay stays above its
//     share while a relay that can take one of its streams has room.
//
// So after a failover the first relay back leads every stream while the
// others are away, and hands streams over as they return until it is down
// to its share.
//
// # Versions
//
// An outbox id, a timestamp or a transaction id is not a safe version. Ids
// and xids are assigned when a transaction first writes, not when it
// commits, so the later commit may carry the smaller number; timestamps
// also come from the transaction's start, collide, and go backwards with
// clock changes. A safe version is ordered by the row itself: a version
// column bumped in the same UPDATE (the row lock orders concurrent writers)
// or the outbox's own per-source counter (Version 0 / SQL NULL), whose row
// lock is held until commit, so versions increase in commit order.
package relay
