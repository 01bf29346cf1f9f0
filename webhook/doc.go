// Package webhook is outboxd's second sink: it delivers messages appended
// with outbox.AppendMessage (or SQL <schema>.append_message) as signed
// HTTP POSTs, at most once per (destination, dedupe key), recording every
// message's fate in the delivery ledger <schema>.deliveries. Like package
// indexer it imports outbox, not the relay engine: each destination gets
// a relay stream of its own (index outbox.MessageIndex(name), its own
// Sink), so a slow or dead receiver holds back nothing else.
//
// # The ledger protocol
//
// A message first reserves its key: it inserts the ledger row, and the
// primary key (destination, dedupe_key) makes exactly one message the
// owner; any other message with that key is recorded in the row's
// duplicates and never sent. Before each request the owner claims the
// attempt (attempts+1, in_flight=true, compare-and-set on the attempts it
// last saw) and commits that claim; after the answer it records it
// (in_flight=false). So whatever stops the relay, the ledger tells what
// may have happened:
//
//   - waiting: no live relay serves the destination (UnroutedSink wrote
//     the row); the destination's sink takes the row over when it reads
//     the message, once a relay serves it.
//   - retrying: the message is parked between attempts until
//     next_attempt_at (see below); its event is acknowledged and the row,
//     payload and attempts included, owns it.
//   - no claim: nothing was sent; the next leader sends.
//   - a claim with no recorded answer (in_flight): the request may have
//     been received. The message is not sent again unless the destination
//     is idempotent=true (the receiver dedupes by Idempotency-Key); it is
//     marked unknown for an operator instead.
//
// Answers (see judge): 2xx delivered; 3xx and 4xx other than 408/429
// failed with the reason, never retried; a request is sent again only when
// the answer proves it was not processed: it never left (connection
// refused), or 408 or 429 (with backoff, at least Retry-After, up to
// MaxAttempts, then failed). Any other outcome after the request was
// written (a 5xx unless Retry5xx, a timeout, a reset, a malformed answer)
// is uncertain: idempotent destinations retry it under the same key, the
// others park the message as unknown. A relay that loses a claim to
// another never acknowledges the message before its row is final. The
// eligibility check (Destination.Check) runs before each attempt, READ
// ONLY with a statement timeout; false marks the message skipped without
// a request. A transient error of it (transientSQLState) runs it again
// under the retry rule below, in line or parked, charging no attempt; its
// runs in a row count towards MaxAttempts (a parked row carries them in
// its check_runs column, written in the UPDATE that parks it; they start
// again from 0 when the check passes or an operator sends the message
// again), so a check that errs on every one fails the message with its
// error, as any other error of it does at once. A relay's shutdown never
// cuts a request short (that would make its outcome unknown): requests
// run to their own timeout.
//
// # Retries without a stall
//
// A message that is to be sent again (an answer that proves it was not
// processed, or any uncertain one for an idempotent destination), or
// whose check is to run again after a transient error, retries
// in line, its page waiting, only while its next attempt would start
// within Destination.RetryInline (retry_inline, default 5s) of its first.
// Past that it is parked: the answer is recorded with state retrying and
// next_attempt_at (its backoff, at least the Retry-After, capped at 10
// minutes, by the database's clock) in the same UPDATE, and only then is
// its event acknowledged, so nothing is acknowledged without a durable
// row. One failing message thus holds its page, and the destination's
// stream, for at most RetryInline plus one attempt (Timeout, and
// CheckTimeout with a check), on top of what holds back every message
// alike (Concurrency, Rate, an open breaker). Sink.Lead, which the relay
// runs while it leads the destination's stream (webhook-<name>), sends
// each parked message when due, one attempt at a time under the same rules
// (the check, Rate, Concurrency shared with the pages, the breaker,
// MaxAttempts, judge), and records it final or parked again. Its claims
// are the same compare-and-set on the attempts: a row found retrying with
// its claim in flight (a relay killed mid-request) is unknown for a
// non-idempotent destination and sent again for an idempotent one, as
// for a page's message.
//
// Order: a destination's messages are not delivered in order. A page's
// messages go concurrently, several pages are at the sink at once, and a
// parked message goes after those behind it. Per key there is nothing to
// order: a dedupe key is one message (any other with it is a duplicate,
// never sent).
//
// # Signatures
//
// Every request carries Standard Webhooks headers: webhook-id (the dedupe
// key), webhook-timestamp (Unix seconds) and webhook-signature
// "v1,<base64 HMAC-SHA256(secret, id.timestamp.body)>", plus
// Idempotency-Key (the dedupe key). Receivers check them with Verify and
// dedupe with package inbox.
//
// # Operators
//
// List and Resolve back outboxd deliveries: an unknown, failed, skipped
// or retrying message (the last not while a retry of it is in flight) is
// resolved as delivered, failed, or retry (sent again under the same
// key), audited in <schema>.audit_log. LedgerCollector exports the ledger
// by state for /metrics.
package webhook
