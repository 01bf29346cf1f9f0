package relaytest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// settleWithin bounds how long the target may take to serve a redelivered
// page after an outage or a cancelled Write ended.
const settleWithin = 30 * time.Second

// outages runs each of the harness's outages in turn, each on documents of
// its own.
func outages(t *testing.T, h *Harness) {
	for n, o := range h.Outages {
		t.Run(o.Name, func(t *testing.T) {
			if o.KnownViolation != "" && os.Getenv("OUTBOXD_CONFORMANCE_KNOWN") == "" {
				t.Skip("known violation (run with OUTBOXD_CONFORMANCE_KNOWN=1): " + o.KnownViolation)
			}
			outage(t, h, o, fmt.Sprintf("outage%d-", n))
		})
	}
}

// outage writes a page while the target is away. The Write may fail as a
// whole, or answer Retry with Outage, or wait for the target until its
// context ends; it must not reject an event, charge one (Retry without
// Outage: the relay dead-letters it once the outage outlasts its
// attempts), or acknowledge one that did not take effect. Once the
// outage ends, the page redelivered is applied, each event once.
func outage(t *testing.T, h *Harness, o Outage, prefix string) {
	warm := h.Event(t, prefix+"before", 1)
	if out := mustWrite(t, h, []outbox.Event{warm}); out[0].Status != outbox.Applied {
		t.Fatalf("before the outage, a new event got %s (%s)", out[0].Status, out[0].Reason)
	}
	page := fresh(t, h, prefix+"during", 5)
	end := o.Begin(t)
	ended := false
	defer func() {
		if !ended {
			end()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), h.OutageWait)
	start := time.Now()
	a := await(t, begin(ctx, h, page), h.OutageWait+h.CancelBound+writeTimeout, "during the outage")
	cancel()
	out, err, took := a.out, a.err, a.at.Sub(start)
	if took > h.OutageWait+h.CancelBound {
		t.Errorf("during the outage Write took %s: more than OutageWait %s and CancelBound %s", took.Round(time.Millisecond), h.OutageWait, h.CancelBound)
	}
	if err != nil {
		t.Logf("during the outage Write failed as a whole after %s: %v", took.Round(time.Millisecond), err)
		out = nil
	} else {
		valid(t, page, out)
		t.Logf("during the outage Write answered after %s: %s", took.Round(time.Millisecond), statuses(out))
	}
	for i, oc := range out {
		switch {
		case oc.Status == outbox.Rejected:
			t.Errorf("event %d was rejected during the outage (%s): an outage must never dead-letter an event", i, oc.Reason)
		case oc.Status == outbox.Retry && !oc.Outage:
			t.Errorf("event %d got Retry without Outage during the outage (%s): the relay charges its attempts and dead-letters it once the outage outlasts them", i, oc.Reason)
		case oc.Status == outbox.Applied || oc.Status == outbox.Stale:
			if got := h.Observe(t, page[i].SourceID); got.Writes == 0 {
				t.Errorf("event %d was acknowledged %s during the outage (%s) but never took effect: the relay would move past it, and it is lost", i, oc.Status, oc.Reason)
			}
		}
	}
	// Observed before the outage ends: an acknowledgement must stand on
	// an effect already there.
	end()
	ended = true
	settled := settle(t, h, page)
	for i, oc := range settled {
		if oc.Status == outbox.Rejected {
			t.Errorf("event %d, redelivered after the outage, was rejected (%s)", i, oc.Reason)
		}
	}
	for i, e := range page {
		if got := h.Observe(t, e.SourceID); got != (Effect{Writes: 1, Rev: 1}) {
			t.Errorf("event %d (%s), redelivered after the outage (%s %s): the target shows %+v, want one write of rev 1", i, e.SourceID, settled[i].Status, settled[i].Reason, got)
		}
	}
}

func cancelledBefore(t *testing.T, h *Harness) {
	warm := h.Event(t, "before", 1)
	mustWrite(t, h, []outbox.Event{warm})
	page := fresh(t, h, "cancelled", 5)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	a := await(t, begin(ctx, h, page), h.CancelBound+writeTimeout, "with a cancelled context")
	if took := a.at.Sub(start); took > h.CancelBound {
		t.Errorf("Write with a cancelled context took %s, more than CancelBound %s", took.Round(time.Millisecond), h.CancelBound)
	}
	acknowledged(t, h, page, a.out, a.err)
	settleOnce(t, h, page)
}

func cancelledWhileHeld(t *testing.T, h *Harness) {
	if h.Stall == nil {
		t.Skip("the harness cannot stall its target (Harness.Stall is nil)")
	}
	warm := h.Event(t, "before", 1)
	mustWrite(t, h, []outbox.Event{warm})
	page := fresh(t, h, "held", 5)
	held, end := h.Stall(t)
	ended := false
	defer func() {
		if !ended {
			end()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := begin(ctx, h, page)
	select {
	case <-held:
	case a := <-done:
		t.Fatalf("Write returned before the target held any request of it: %v %s", a.err, statuses(a.out))
	case <-time.After(writeTimeout):
		cancel()
		end()
		<-done // no writer outlives the test
		t.Fatalf("the target held no request of the Write within %s", writeTimeout)
	}
	cancel()
	cancelled := time.Now()
	r := await(t, done, h.CancelBound+writeTimeout, "after its context was cancelled")
	if took := r.at.Sub(cancelled); took > h.CancelBound {
		t.Errorf("Write returned %s after its context was cancelled: more than CancelBound %s", took.Round(time.Millisecond), h.CancelBound)
	}
	// Checked while the target still holds what was sent: an Applied
	// answer must stand on an effect already there.
	acknowledged(t, h, page, r.out, r.err)
	end()
	ended = true
	settleOnce(t, h, page)
}

// acknowledged checks a cancelled Write's answer: an error, or outcomes
// that acknowledge (Applied, Stale) only events the target shows.
func acknowledged(t *testing.T, h *Harness, page []outbox.Event, out []outbox.Outcome, err error) {
	t.Helper()
	if err != nil {
		t.Logf("the cancelled Write failed as a whole: %v", err)
		return
	}
	valid(t, page, out)
	t.Logf("the cancelled Write answered %s", statuses(out))
	for i, o := range out {
		if o.Status != outbox.Applied && o.Status != outbox.Stale {
			continue
		}
		if got := h.Observe(t, page[i].SourceID); got.Writes == 0 {
			t.Errorf("event %d got %s from the cancelled Write (%s) but did not take effect: the relay would acknowledge an event that is lost", i, o.Status, o.Reason)
		}
	}
}

// settleOnce redelivers page and checks that each event then took effect
// exactly once.
func settleOnce(t *testing.T, h *Harness, page []outbox.Event) {
	t.Helper()
	for i, o := range settle(t, h, page) {
		if o.Status == outbox.Rejected {
			t.Errorf("event %d, redelivered, was rejected (%s)", i, o.Reason)
		}
	}
	wantOnce(t, h, page)
}

// settle redelivers page as the relay does: the events still pending
// (an error, or Retry) are written again with a short backoff until each
// has a final outcome, within settleWithin. It returns the final outcome
// of each event.
func settle(t *testing.T, h *Harness, page []outbox.Event) []outbox.Outcome {
	t.Helper()
	final := make([]outbox.Outcome, len(page))
	pending := make([]int, len(page))
	for i := range pending {
		pending[i] = i
	}
	deadline := time.Now().Add(settleWithin)
	last := ""
	for wait := 20 * time.Millisecond; len(pending) > 0; wait = min(2*wait, time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("%d events still not settled %s after the target came back; last: %s", len(pending), settleWithin, last)
		}
		events := make([]outbox.Event, len(pending))
		for j, i := range pending {
			events[j] = page[i]
		}
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		out, err := h.Sink.Write(ctx, events)
		cancel()
		if err != nil {
			last = err.Error()
			time.Sleep(wait)
			continue
		}
		valid(t, events, out)
		var next []int
		for j, o := range out {
			if o.Status == outbox.Retry {
				last = o.Reason
				next = append(next, pending[j])
				continue
			}
			final[pending[j]] = o
		}
		pending = next
		if len(pending) > 0 {
			time.Sleep(wait)
		}
	}
	return final
}

// answer is what a Write returned, and when.
type answer struct {
	out []outbox.Outcome
	err error
	at  time.Time
}

// begin runs a Write of page in its own goroutine.
func begin(ctx context.Context, h *Harness, page []outbox.Event) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		out, err := h.Sink.Write(ctx, page)
		done <- answer{out, err, time.Now()}
	}()
	return done
}

// await waits for a Write begun with begin, failing the test when it has
// not returned within limit: a sink that ignores its context must fail
// the suite, not hang it.
func await(t *testing.T, done <-chan answer, limit time.Duration, what string) answer {
	t.Helper()
	select {
	case a := <-done:
		return a
	case <-time.After(limit):
		t.Fatalf("Write %s had not returned after %s", what, limit)
		return answer{}
	}
}
