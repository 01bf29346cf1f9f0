// Command tutorials is outboxd's example business service, a binary of its
// own (`make demo` builds bin/tutorials): an idempotent tutorials API that
// appends its events with package outbox in its own transactions, and the
// scripted client the demo plays against it. It uses only outboxd's public
// packages, the way an application would.
//
//	tutorials api  [flags]   serve the API described below
//	tutorials demo [flags]   play a retrying, double-clicking client against it
//
// # API
//
//	POST   /api/tutorials        {"title", "body", "tags", "request_id"?} -> 201 (or 200, see below)
//	PUT    /api/tutorials/{id}   {"title", "body", "tags"}                -> 200, full replacement
//	DELETE /api/tutorials/{id}                                            -> 200 {"id","deleted","version"}
//	GET    /api/tutorials/{id}   from PostgreSQL                          -> 200 | 404
//	GET    /api/search?q=&size=  from the Elasticsearch alias <index> (tombstones filtered)
//	PUT    /api/authors/{id}     {"name"}: an author names themselves     -> 200 {"id","name"}
//	GET    /api/authors/{id}/tutorials  the author's cards (cards index)  -> 200
//	GET    /metrics, /healthz
//
// Writes need two headers. X-User-ID names the caller (401 without it);
// this example trusts it as if an authenticating gateway had set it. Only a
// tutorial's author may change or delete it (403). Idempotency-Key names
// the operation; it is required on every write, POST, PUT and DELETE alike
// (400 naming the header without it): the client makes a fresh UUID per
// operation and sends it again on every retry of that operation.
//
// Invalid input (bad JSON, unknown fields, missing or empty title, a title
// over 200 characters, a body field over 64 KiB, a request over 80 KiB) is
// refused with {"error": "...", "field": "..."} before the key is claimed,
// so a corrected request may reuse the key.
//
// # Idempotency contract
//
// A key is scoped to its user: (user, key) is the primary key of
// idempotency_keys, and one user's key is never seen by another. The
// request's identity is SHA-256 over method, path and the payload
// re-encoded with sorted keys, so whitespace and key order do not matter.
//
//   - First use: one transaction takes an advisory lock on the key, claims
//     it (INSERT ... ON CONFLICT DO NOTHING: the primary key, not a prior
//     SELECT, picks the winner) and writes the business row, its outbox
//     event and the key's SUCCESS with the stored response status and body.
//   - Same key, same payload, SUCCESS: the stored response is replayed
//     byte for byte with "Idempotent-Replayed: true". Nothing is written.
//   - Same key, other payload (or other method or path): 409 naming
//     Idempotency-Key. Nothing is written.
//   - Same key while the first request is still running (its transaction
//     holds the key's lock): 409 within 0.1 s, with Retry-After, never a
//     second write.
//   - A business refusal (404, 403) rolls the write back to a savepoint and
//     marks the key FAILED with the response: a retry with the same payload
//     runs again.
//   - An internal error, a crash, a PostgreSQL restart or a killed session
//     before the commit rolls back the claim with the write: the key is as
//     before the request and a retry runs at once. (A PROCESSING key
//     committed by an earlier release, which claimed in a transaction of its
//     own, is busy until its 30 s lease runs out, then taken over.)
//   - A crash after the commit but before the response: the retry replays.
//   - Keys expire after 24 h by default; StartCleanup deletes expired keys
//     on a cron schedule. An expired key still present counts as new.
//
// The (author_id, request_id) unique constraint is the last line of
// defence: request_id defaults to the Idempotency-Key, and a create that
// collides with an existing request_id (another key, same request_id)
// returns the existing record with 200 and writes nothing.
//
// # Cards: documents from several tables
//
// Beside the event-fed index, the API declares (at start, DeclareCards) a
// definition-fed one, tutorial-cards by default: SQL joining tutorials and
// authors, and watches on both tables. It appends nothing for it. A write
// to tutorials, or a rename in authors, makes the watches append refresh
// events in the same transaction, and the relay reads the affected cards
// again (every tutorial of a renamed author), at versions that order the
// reads. See cards.go.
//
// # Versions
//
// Every write bumps the row's version in the same UPDATE that changes it
// and appends its outbox event at that version, in the same transaction;
// deletes are soft and append a delete event at the bumped version. The
// indexer's version gate (indexer/gate.go) keeps the highest version per
// document, so duplicates, replays and reordering cannot resurrect or roll
// back a document.
package main
