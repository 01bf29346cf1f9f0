package relaytest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// writeTimeout bounds every Write the suite expects to succeed: a hang is
// a failure, not a stuck test.
const writeTimeout = 60 * time.Second

// Exercise runs the conformance suite against the sink newSink builds,
// one fresh Harness per subtest; the subtests run in parallel. See the
// package doc for the contract it checks.
func Exercise(t *testing.T, newSink func(t *testing.T) Harness) {
	t.Helper()
	run := func(name string, f func(t *testing.T, h *Harness)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newSink(t)
			h.check(t)
			f(t, &h)
		})
	}
	run("a page of one event gets one outcome, Applied, and takes effect once", pageOfOne)
	run("a page of many events gets one outcome per event, in order", pageOfMany)
	run("several events of one document in a page get one outcome each, and the target holds the Applied one", duplicatesInPage)
	run("a page written twice takes effect once, and the second write answers Applied or Stale", writtenTwice)
	run("a page written twice at once takes effect once", writtenTwiceAtOnce)
	run("an older event of a document delivered after a newer one changes nothing", olderAfterNewer)
	run("a bad event is rejected alone, and the rest of its page is applied", badEventAlone)
	run("an outage of the target is reported as an outage, and the page is applied once it ends", outages)
	run("a Write whose context is already cancelled returns promptly and acknowledges nothing that did not take effect", cancelledBefore)
	run("a Write cancelled while the target holds its requests returns within the bound and acknowledges nothing that did not take effect", cancelledWhileHeld)
}

func pageOfOne(t *testing.T, h *Harness) {
	page := fresh(t, h, "one", 1)
	out := mustWrite(t, h, page)
	if out[0].Status != outbox.Applied {
		t.Fatalf("a new event got %s (%s), want applied", out[0].Status, out[0].Reason)
	}
	wantOnce(t, h, page)
}

// pageOfMany mixes new events, redeliveries of applied ones and bad ones
// at known positions, so that an outcome in the wrong place shows.
func pageOfMany(t *testing.T, h *Harness) {
	earlier := fresh(t, h, "early", 20)
	mustWrite(t, h, earlier)
	const n = 200
	page := make([]outbox.Event, n)
	kind := make([]byte, n) // 'n' new, 'r' redelivered, 'b' bad
	for i := range page {
		switch {
		case i%50 == 0 || i%50 == 7 || i == n-1:
			page[i], kind[i] = h.Bad(t, fmt.Sprintf("bad%03d", i)), 'b'
		case i%10 == 3:
			page[i], kind[i] = earlier[i/10], 'r'
		default:
			page[i], kind[i] = h.Event(t, fmt.Sprintf("many%03d", i), 1), 'n'
		}
	}
	out := mustWrite(t, h, page)
	for i, o := range out {
		switch kind[i] {
		case 'n':
			if o.Status != outbox.Applied {
				t.Errorf("event %d (new) got %s (%s), want applied", i, o.Status, o.Reason)
			}
		case 'r':
			if o.Status != outbox.Applied && o.Status != outbox.Stale {
				t.Errorf("event %d (a redelivery) got %s (%s), want applied or stale", i, o.Status, o.Reason)
			}
		case 'b':
			if o.Status != outbox.Rejected {
				t.Errorf("event %d (bad) got %s (%s), want rejected", i, o.Status, o.Reason)
			}
		}
	}
	for i, e := range page {
		want := Effect{Writes: 1, Rev: 1}
		if kind[i] == 'b' {
			want = Effect{}
		}
		if got := h.Observe(t, e.SourceID); got != want {
			t.Errorf("event %d (%s): the target shows %+v, want %+v", i, e.SourceID, got, want)
		}
	}
}

// duplicatesInPage sends one document three times as the same event, one
// at rev 1 then 2, and one at rev 2 then 1. Whichever the sink applies
// (the newest, or the first to reserve its key), exactly one event of
// each document is Applied and the target holds that one.
func duplicatesInPage(t *testing.T, h *Harness) {
	a := h.Event(t, "dup-a", 1)
	b1, b2 := h.Event(t, "dup-b", 1), h.Event(t, "dup-b", 2)
	c2 := h.Event(t, "dup-c", 2)
	c1 := h.Event(t, "dup-c", 1)
	d := h.Event(t, "dup-d", 1)
	page := []outbox.Event{a, b1, a, c2, d, b2, c1, a}
	revs := []int{1, 1, 1, 2, 1, 2, 1, 1}
	out := mustWrite(t, h, page)
	for _, key := range []string{"dup-a", "dup-b", "dup-c", "dup-d"} {
		applied := -1
		for i, e := range page {
			if e.SourceID != key {
				continue
			}
			switch out[i].Status {
			case outbox.Applied:
				if applied >= 0 {
					t.Errorf("%s: events %d and %d both applied: the page's outcomes are %s", key, applied, i, statuses(out))
				}
				applied = i
			case outbox.Stale:
			default:
				t.Errorf("%s: event %d got %s (%s), want applied or stale", key, i, out[i].Status, out[i].Reason)
			}
		}
		got := h.Observe(t, key)
		switch {
		case applied < 0:
			t.Errorf("%s: no event of it applied: the page's outcomes are %s", key, statuses(out))
		case got != Effect{Writes: 1, Rev: revs[applied]}:
			t.Errorf("%s: event %d (rev %d) is the applied one, but the target shows %+v: outcomes out of order, or more than one write", key, applied, revs[applied], got)
		}
	}
}

func writtenTwice(t *testing.T, h *Harness) {
	page := fresh(t, h, "twice", 20)
	for i, o := range mustWrite(t, h, page) {
		if o.Status != outbox.Applied {
			t.Fatalf("event %d, new, got %s (%s)", i, o.Status, o.Reason)
		}
	}
	for i, o := range mustWrite(t, h, page) {
		if o.Status != outbox.Applied && o.Status != outbox.Stale {
			t.Errorf("event %d written again got %s (%s), want applied or stale", i, o.Status, o.Reason)
		}
	}
	wantOnce(t, h, page)
}

func writtenTwiceAtOnce(t *testing.T, h *Harness) {
	page := fresh(t, h, "at-once", 20)
	var wg sync.WaitGroup
	outs := make([][]outbox.Outcome, 2)
	errs := make([]error, 2)
	for w := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
			defer cancel()
			outs[w], errs[w] = h.Sink.Write(ctx, page)
		}()
	}
	wg.Wait()
	for w := range outs {
		if errs[w] != nil {
			t.Fatalf("Write %d: %v", w, errs[w])
		}
		valid(t, page, outs[w])
	}
	for i := range page {
		a, b := outs[0][i], outs[1][i]
		if (a.Status != outbox.Applied && a.Status != outbox.Stale) || (b.Status != outbox.Applied && b.Status != outbox.Stale) {
			t.Errorf("event %d got %s (%s) and %s (%s), want applied or stale from both writes", i, a.Status, a.Reason, b.Status, b.Reason)
		}
	}
	wantOnce(t, h, page)
}

func olderAfterNewer(t *testing.T, h *Harness) {
	newer := h.Event(t, "order", 2)
	older := h.Event(t, "order", 1)
	if o := mustWrite(t, h, []outbox.Event{newer})[0]; o.Status != outbox.Applied {
		t.Fatalf("the newer event got %s (%s)", o.Status, o.Reason)
	}
	if o := mustWrite(t, h, []outbox.Event{older})[0]; o.Status != outbox.Applied && o.Status != outbox.Stale {
		t.Errorf("the older event, after the newer one, got %s (%s), want stale (or applied)", o.Status, o.Reason)
	}
	if got := h.Observe(t, "order"); got != (Effect{Writes: 1, Rev: 2}) {
		t.Errorf("the target shows %+v, want the newer event's one write", got)
	}
}

func badEventAlone(t *testing.T, h *Harness) {
	page := fresh(t, h, "good", 9)
	page[4] = h.Bad(t, "bad")
	out := mustWrite(t, h, page)
	for i, o := range out {
		switch {
		case i == 4 && o.Status != outbox.Rejected:
			t.Errorf("the bad event got %s (%s), want rejected", o.Status, o.Reason)
		case i != 4 && o.Status != outbox.Applied:
			t.Errorf("good event %d, next to a bad one, got %s (%s), want applied", i, o.Status, o.Reason)
		}
	}
	if got := h.Observe(t, "bad"); got != (Effect{}) {
		t.Errorf("the bad event shows in the target: %+v", got)
	}
	wantOnce(t, h, append(page[:4:4], page[5:]...))
}

// fresh returns n events of new documents prefix000, prefix001, ... at rev 1.
func fresh(t *testing.T, h *Harness, prefix string, n int) []outbox.Event {
	page := make([]outbox.Event, n)
	for i := range page {
		page[i] = h.Event(t, fmt.Sprintf("%s%03d", prefix, i), 1)
	}
	return page
}

// mustWrite writes page and fails the test on an error or an invalid
// answer.
func mustWrite(t *testing.T, h *Harness, page []outbox.Event) []outbox.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	out, err := h.Sink.Write(ctx, page)
	if err != nil {
		t.Fatalf("Write of %d events: %v", len(page), err)
	}
	valid(t, page, out)
	return out
}

// valid checks the form of an answer: one outcome per event, each a
// status the relay knows, with a reason where the relay records one.
func valid(t *testing.T, page []outbox.Event, out []outbox.Outcome) {
	t.Helper()
	if len(out) != len(page) {
		t.Fatalf("Write returned %d outcomes for %d events", len(out), len(page))
	}
	for i, o := range out {
		switch o.Status {
		case outbox.Applied, outbox.Stale:
		case outbox.Retry, outbox.Rejected:
			if o.Reason == "" {
				t.Errorf("event %d: %s without a reason (the relay logs it and stores it with a dead letter)", i, o.Status)
			}
		default:
			t.Errorf("event %d: no valid status (%d)", i, o.Status)
		}
		if o.Outage && o.Status != outbox.Retry {
			t.Errorf("event %d: Outage on %s: only a Retry can be an outage", i, o.Status)
		}
	}
}

// wantOnce checks that every event of page (each of its own document, at
// rev 1) took effect exactly once.
func wantOnce(t *testing.T, h *Harness, page []outbox.Event) {
	t.Helper()
	for i, e := range page {
		if got := h.Observe(t, e.SourceID); got != (Effect{Writes: 1, Rev: 1}) {
			t.Errorf("event %d (%s): the target shows %+v, want one write of rev 1", i, e.SourceID, got)
		}
	}
}

func statuses(out []outbox.Outcome) string {
	s := make([]string, len(out))
	for i, o := range out {
		s[i] = o.Status.String()
		if o.Outage {
			s[i] += "(outage)"
		}
	}
	return strings.Join(s, " ")
}
