// Package relaytest is the conformance suite of relay.Sink: what the relay
// engine relies on from any sink, checked against the sink's real target
// (a server, a receiver), in the spirit of river's driver test suite. A
// sink's package runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		relaytest.Exercise(t, func(t *testing.T) relaytest.Harness {
//			// a new sink with a target of its own (an index, a
//			// destination), torn down by t.Cleanup
//			return relaytest.Harness{Sink: s, Event: ..., Bad: ..., Observe: ..., Outages: ...}
//		})
//	}
//
// The Harness gives the sink under test, a way to make valid events and
// bad ones for it, a way to observe the effect of an event in the target
// without going through the sink (Observe), ways to take the target away
// (Outages) and, optionally, to stall it (Stall). Proxy, a TCP proxy with
// Cut and Stall, gives both for any server reached over TCP. The package
// imports relay and outbox only, never a sink.
//
// # The contract
//
// These are the promises relay.Sink and outbox.Outcome make to the relay;
// each is a sentence-named subtest.
//
//  1. One outcome per event, in order: Write returns len(events) outcomes,
//     the i-th for events[i], each Applied, Stale, Retry or Rejected, with
//     a Reason for Retry and Rejected and Outage only on Retry; for a page
//     of one event, of two hundred (new events, redeliveries and bad events
//     at known places), and of several events of one document. Of those,
//     exactly one is Applied on a new document (the newest, or the first
//     to reserve its key, as the sink's rule says), the others Stale, and
//     the target holds the Applied one after one write.
//  2. Idempotent under redelivery: a page written again, or twice at once
//     (the relay keeps several pages in flight, and a deposed leader's
//     Write may still run), answers Applied or Stale and adds no effect;
//     an older event of a document delivered after a newer one changes
//     nothing.
//  3. A per-event failure is that event's alone: a bad event in a page of
//     good ones is Rejected, the others Applied.
//  4. An outage is an outage: while the target is away, Write returns an
//     error, or Retry with Outage, or waits for the target until its
//     context ends. It never rejects an event (the relay would park it in
//     dead_letters), never answers Retry without Outage (the relay charges
//     the event an attempt, and dead-letters it once the outage outlasts
//     them) and never acknowledges (Applied, Stale) an event that did not
//     take effect (the relay would move past it: lost). Once the target is
//     back, the page redelivered as the relay does (what is still pending,
//     again, with backoff) is applied, each event once.
//  5. Cancellation: a Write whose context is cancelled, before it starts
//     or while the target holds its requests, returns within
//     Harness.CancelBound and acknowledges only events that took effect;
//     the page redelivered afterwards is applied, each event once.
//
// "Took effect" is what Harness.Observe shows: the writes the target
// acknowledged for a document and the revision it holds. A check of an
// acknowledgement is made while the outage or the stall still lasts, so
// it must stand on an effect already there.
//
// A known violation of a sink is kept in the tree with
// Outage.KnownViolation: its subtest is skipped with the reason, and runs
// (and fails) with OUTBOXD_CONFORMANCE_KNOWN=1.
package relaytest
