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
// a request. A relay's shutdown never
// cuts a request short (that would make its outcome unknown): requests
// run to their own timeout.
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
// List and Resolve back outboxd deliveries: an unknown or failed message
// is resolved as delivered, failed, or retry (sent again under the same
// key), audited in <schema>.audit_log. LedgerCollector exports the ledger
// by state for /metrics.
package webhook
