package relaytest

import (
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// Harness is what a sink's test gives the suite: the sink under test, new
// for one subtest and writing to a target of its own, and the means to
// drive and watch that target from outside the sink.
type Harness struct {
	// Sink is the sink under test.
	Sink relay.Sink

	// Event returns a valid event of the document key at revision rev
	// (1, 2, ...): a higher rev is a later change of the same document,
	// as a later commit would append it. The suite calls it once per
	// (key, rev) and sends that same value again to model a redelivery,
	// so a harness that needs real outbox rows may append one per call.
	Event func(t *testing.T, key string, rev int) outbox.Event

	// Bad returns an event of the document key that the sink must
	// reject whatever the target's state: a document the target refuses
	// (a mapping conflict), or a message the sink can never deliver.
	Bad func(t *testing.T, key string) outbox.Event

	// Observe reads the target itself, never through the sink, and tells
	// what the events of key did there.
	Observe func(t *testing.T, key string) Effect

	// Outages are ways to take the target away while the process stays
	// up: a proxy that stops accepting connections, a server answering
	// 503 to every request. At least one. The suite runs them one after
	// the other on this harness.
	Outages []Outage

	// Stall, if set, makes the target take requests and never answer
	// them: held is closed once a request of the sink is held. end drops
	// what was held, which must never take effect (a proxy that closes
	// those connections without forwarding them), and lets later
	// requests through. Without Stall the suite checks cancellation only
	// with a context cancelled before Write starts.
	Stall func(t *testing.T) (held <-chan struct{}, end func())

	// CancelBound is how long Write may take to return once its context
	// is done; 0 means 5s. A sink that lets requests in flight run to
	// their own timeout (so that their outcome is known) adds that
	// timeout here.
	CancelBound time.Duration

	// OutageWait is how long the suite lets a Write run during an outage
	// before it cancels the Write's context; 0 means 3s. A sink may
	// return at once (an error, Retry with Outage) or wait for the
	// target until its context ends.
	OutageWait time.Duration
}

// Effect is what the events of one document did in the target.
type Effect struct {
	// Writes counts the times an event of the document took effect: an
	// index operation the server acknowledged, a request the receiver
	// got. A redelivered event that is already there must not add one.
	Writes int
	// Rev is the revision the target holds now, 0 for none.
	Rev int
}

// Outage is one way to take the target away.
type Outage struct {
	// Name says what is taken away, for the subtest's name: "the
	// receiver refuses connections".
	Name string
	// Begin starts the outage; end, called once, ends it. The suite
	// calls end before it expects the target back.
	Begin func(t *testing.T) (end func())
	// KnownViolation, when set, says how the sink is known to break the
	// contract in this outage: the subtest is skipped with this reason,
	// and run (to fail) when OUTBOXD_CONFORMANCE_KNOWN=1. It keeps a
	// finding reproducible in the tree until it is fixed.
	KnownViolation string
}

func (h *Harness) check(t *testing.T) {
	t.Helper()
	switch {
	case h.Sink == nil:
		t.Fatal("relaytest: Harness.Sink is nil")
	case h.Event == nil, h.Bad == nil, h.Observe == nil:
		t.Fatal("relaytest: Harness.Event, Bad and Observe are all required")
	case len(h.Outages) == 0:
		t.Fatal("relaytest: Harness.Outages: give at least one way to take the target away")
	}
	for _, o := range h.Outages {
		if o.Name == "" || o.Begin == nil {
			t.Fatal("relaytest: every Outage needs a Name and a Begin")
		}
	}
	if h.CancelBound <= 0 {
		h.CancelBound = 5 * time.Second
	}
	if h.OutageWait <= 0 {
		h.OutageWait = 3 * time.Second
	}
}
