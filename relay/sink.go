package relay

import (
	"context"

	"github.com/outboxd/outboxd/outbox"
)

// Sink receives events. The relay may call Write concurrently, with up to
// Config.InFlight pages at once (each page's events in reading order), and
// acknowledges the pages in reading order whatever order they finish in;
// a sink may also process one page's events in parallel.
//
// Write may see an event more than once (after a crash, a failover, a
// retry or a replay); it must be idempotent. It returns one Outcome per
// event, in order. A non-nil error means the sink as a whole is unavailable
// (connection refused, every node down): the relay retries the whole batch
// with backoff, indefinitely, without counting it against any event's
// attempt limit, so an outage never dead-letters the backlog.
//
// Package relaytest checks this contract against a sink's real target;
// every sink passes it (see relaytest.Exercise).
type Sink interface {
	Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error)
}

// LeaderWork is an optional interface of a Sink: work of the sink's own,
// apart from the pages it is given, that one process at a time must do
// for the stream (a webhook destination's retries of its parked
// messages). The relay runs Lead for as long as it leads the stream and
// cancels ctx when it stops leading; it waits for Lead to return before it
// lets the stream go, so a new leader's Lead never overlaps it unless this
// process lost its session (a crash, a partition), which the sink's own
// records must then settle. Lead must return promptly once ctx is
// cancelled, apart from requests it must not cut short.
type LeaderWork interface {
	Lead(ctx context.Context)
}
