package webhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/outbox"
)

// maxRetryAfter caps how long a receiver's Retry-After may put a message
// off: a receiver asking for hours is not given them one attempt at a time.
const maxRetryAfter = 10 * time.Minute

// send makes the attempts of one message whose row is ent, until the row
// is final or parked, and answers for it as Write does. ent.state is the
// row's state while this sink works on it: reserved for a message of a
// page, retrying for a parked one (see Lead). A message retries in line
// while its next attempt would start within inline of its first one here;
// otherwise it is parked as retrying, due after its backoff (at least the
// receiver's Retry-After), and the outcome acknowledges it: the row owns
// it from then on. A transient check error runs the check again under
// the same rule, with no request charged; its runs in a row count towards
// MaxAttempts, across parks too (ent.checkRuns, the row's check_runs,
// written when it is parked). Lead passes inline 0,
// so that a parked message makes one attempt each time it is due.
func (s *Sink) send(ctx context.Context, e *outbox.Event, ent entry, inline time.Duration) outbox.Outcome {
	name, key := s.dest.Name, e.SourceID
	done := context.WithoutCancel(ctx) // what was sent is always recorded
	if ent.inFlight {
		// A relay stopped (or lost the stream) between claiming an attempt
		// and recording its answer: the request may have been received.
		ent.uncertain = true
		if !s.dest.Idempotent {
			return s.finish(done, e, ent, StateUnknown, 0, "the relay stopped while a request was in flight: it may have been received")
		}
	}
	began := time.Now()
	unsent := 0 // a parked message brings its check's erred runs in ent
	for {
		if err := s.limit.wait(ctx); err != nil {
			return outage(errShutdown)
		}
		if s.dest.Check != "" {
			ok, err := s.eligible(ctx, key, e.Document)
			if err == nil {
				ent.checkRuns = 0 // it ran: the erred runs are no longer in a row
			}
			var pgErr *pgconn.PgError
			switch {
			case errors.As(err, &pgErr) && transientSQLState(pgErr.Code) && ent.checkRuns+1 < s.dest.MaxAttempts:
				// Says nothing about this message: run the check again,
				// under the rule of a request sent again (in line only
				// within inline of the first try, else parked), so that a
				// check that keeps erring never holds its page longer
				// than a receiver that keeps refusing.
				ent.checkRuns++
				s.log.Warn("webhook: check failed for a passing reason; running it again", "destination", name, "dedupe_key", key,
					"sqlstate", pgErr.Code, "err", pgErr.Message)
				wait := checkRetryWait(s.dest, ent.checkRuns-1)
				if time.Since(began)+wait > inline {
					return s.park(done, e, ent, wait, attempt{reason: checkRetryReason(ent.checkRuns, s.dest.MaxAttempts, pgErr)})
				}
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return outage(errShutdown)
				}
				continue
			case errors.As(err, &pgErr):
				if transientSQLState(pgErr.Code) {
					ent.checkRuns++ // the last of MaxAttempts
				}
				return s.finish(done, e, ent, StateFailed, 0, fmt.Sprintf("check: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code))
			case err != nil:
				return outage(fmt.Errorf("webhook: check: %w", err))
			case !ok:
				return s.finish(done, e, ent, StateSkipped, 0, "check returned false: not sent")
			}
		}
		probe, err := s.breaker.admit(ctx)
		if err != nil {
			return outage(errShutdown)
		}
		select {
		case s.requests <- struct{}{}:
		case <-ctx.Done():
			s.breaker.result(probe, false)
			return outage(errShutdown)
		}
		claimed, err := s.ledger.claim(ctx, name, key, e.ID, ent)
		if err != nil || !claimed {
			<-s.requests
			s.breaker.result(probe, false)
			if err != nil {
				return outage(err)
			}
			// Another relay works on the message: never acknowledge it
			// before its row is final or parked; continue from the row.
			next, out, over := s.takeOver(ctx, done, e, ent)
			if over {
				return out
			}
			ent = next
			continue
		}
		n := ent.attempts + 1
		start := time.Now()
		a := s.post(done, key, e.Document)
		a.reason = s.dest.Redact(a.reason) // a url.Error or an echoing receiver quotes the URL
		<-s.requests
		s.breaker.result(probe, a.verdict == vDelivered || a.verdict == vRefused)
		s.metrics.observe(name, a, time.Since(start))
		ent.attempts, ent.inFlight = n, false
		switch a.verdict {
		case vDelivered:
			return s.finish(done, e, ent, StateDelivered, a.status, "")
		case vRefused:
			return s.finish(done, e, ent, StateFailed, a.status, a.reason)
		case vUncertain:
			ent.uncertain = true
			if !s.dest.Idempotent {
				return s.finish(done, e, ent, StateUnknown, 0, a.reason)
			}
		}
		if a.unsent {
			// No byte reached the receiver (refused, DNS, TLS, a dead
			// kept-alive connection): the attempt is not charged, so a
			// receiver that is down fails no message. A receiver no
			// request reaches is the destination's outage: past the
			// in-line budget a page's message goes back to the relay, a
			// parked one stays parked.
			unsent++
			wait := backoff(s.dest.BackoffBase, s.dest.BackoffMax, max(unsent, n)-1)
			if time.Since(began)+wait > inline && ent.state == StateRetrying {
				return s.park(done, e, ent, wait, a)
			}
			matched, err := s.ledger.record(done, name, key, e.ID, n, ent.state, ent.state, 0, a.status, a.reason, ent.uncertain, true, ent.checkRuns)
			if err != nil {
				return outage(err)
			}
			if !matched {
				next, out, over := s.takeOver(ctx, done, e, ent)
				if over {
					return out
				}
				ent = next
				continue
			}
			ent.attempts = n - 1
			if time.Since(began)+wait > inline {
				return outage(fmt.Errorf("webhook: destination %s: the receiver cannot be reached: %s", name, a.reason))
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return outage(errShutdown)
			}
			continue
		}
		if n >= s.dest.MaxAttempts {
			final := StateFailed
			if ent.uncertain {
				final = StateUnknown
			}
			return s.finish(done, e, ent, final, a.status, fmt.Sprintf("gave up after %d attempts: %s", n, a.reason))
		}
		wait := max(backoff(s.dest.BackoffBase, s.dest.BackoffMax, n-1), min(a.retryAfter, maxRetryAfter))
		if time.Since(began)+wait > inline {
			return s.park(done, e, ent, wait, a)
		}
		matched, err := s.ledger.record(done, name, key, e.ID, n, ent.state, StateReserved, 0, a.status, a.reason, ent.uncertain, false, ent.checkRuns)
		if err != nil {
			return outage(err)
		}
		if !matched {
			next, out, over := s.takeOver(ctx, done, e, ent)
			if over {
				return out
			}
			ent = next
			continue
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return outage(errShutdown)
		}
	}
}

// finish records a final state for the attempt ent.attempts; the relay
// may then acknowledge the message.
func (s *Sink) finish(ctx context.Context, e *outbox.Event, ent entry, state string, status int, reason string) outbox.Outcome {
	matched, err := s.ledger.record(ctx, s.dest.Name, e.SourceID, e.ID, ent.attempts, ent.state, state, 0, status, reason, ent.uncertain, false, ent.checkRuns)
	if err != nil {
		return outage(err)
	}
	if !matched {
		return s.notRecorded(ctx, e, ent, state, reason)
	}
	s.metrics.count(s.dest.Name, state)
	if state != StateDelivered {
		s.log.Warn("webhook: message not delivered", "destination", s.dest.Name, "dedupe_key", e.SourceID, "state", state, "reason", reason)
	}
	return applied
}

// park records the attempt ent.attempts as one to be made again after
// wait, by the destination's leader (Lead), and acknowledges the message:
// its row, payload, attempts and check runs included, now holds it
// durably.
func (s *Sink) park(ctx context.Context, e *outbox.Event, ent entry, wait time.Duration, a attempt) outbox.Outcome {
	matched, err := s.ledger.record(ctx, s.dest.Name, e.SourceID, e.ID, ent.attempts, ent.state, StateRetrying, wait, a.status, a.reason, ent.uncertain, a.unsent, ent.checkRuns)
	if err != nil {
		return outage(err)
	}
	if !matched {
		return s.notRecorded(ctx, e, ent, StateRetrying, a.reason)
	}
	if ent.state != StateRetrying {
		s.log.Info("webhook: message parked for a later retry; the destination's other messages go on", "destination", s.dest.Name,
			"dedupe_key", e.SourceID, "attempts", ent.attempts, "retry_in", wait.Round(time.Millisecond), "reason", a.reason)
	}
	s.wakeRetries()
	return applied
}

// notRecorded answers for a message whose row another relay or an
// operator moved on before this answer was recorded: the answer is not
// the message's outcome.
func (s *Sink) notRecorded(ctx context.Context, e *outbox.Event, ent entry, state, reason string) outbox.Outcome {
	s.log.Warn("webhook: answer not recorded: another relay or an operator moved the message on", "destination", s.dest.Name,
		"dedupe_key", e.SourceID, "event_id", e.ID, "state", state, "reason", reason)
	seen := entry{eventID: e.ID, state: ent.state, attempts: ent.attempts}
	next, _, over := s.takeOver(ctx, ctx, e, seen)
	if !over {
		return outbox.Outcome{Status: outbox.Retry, Reason: fmt.Sprintf("message %s/%s still %s at attempt %d", s.dest.Name, e.SourceID, next.state, next.attempts)}
	}
	return outbox.Outcome{Status: outbox.Stale, Reason: "settled by another relay or an operator"}
}

// takeOver continues a message whose ledger row another relay moved on.
// over is true when the message is finished here (out is its outcome);
// otherwise next is the row to continue from. A row final, parked, or
// held by another message is acknowledged (a parked row is the
// destination leader's to retry when due); a claim still in flight is
// waited for, up to the request timeout and a margin, after which its
// relay is taken to be gone: the request may have been written, so a
// non-idempotent message becomes unknown, never re-sent.
func (s *Sink) takeOver(ctx, done context.Context, e *outbox.Event, seen entry) (next entry, out outbox.Outcome, over bool) {
	name, key := s.dest.Name, e.SourceID
	var waitedOn entry
	waited := false
	for {
		row, err := s.ledger.read(done, name, key, e.ID)
		if err != nil {
			return seen, outage(fmt.Errorf("webhook: ledger: read %s/%s: %w", name, key, err)), true
		}
		switch {
		case row.eventID != e.ID:
			return row, outbox.Outcome{Status: outbox.Stale, Reason: fmt.Sprintf("the key is now held by message %d", row.eventID)}, true
		case row.state != seen.state:
			return row, outbox.Outcome{Status: outbox.Stale, Reason: "moved on by another relay or an operator: " + row.state}, true
		case !row.inFlight && row.state == StateRetrying:
			// Parked again by another relay: due when its row says.
			return row, outbox.Outcome{Status: outbox.Stale, Reason: "parked by another relay for a later retry"}, true
		case !row.inFlight:
			return row, outbox.Outcome{}, false
		case waited && row.attempts == waitedOn.attempts:
			// The same claim outlived its request's timeout: its relay is gone.
			row.uncertain = true
			if s.dest.Idempotent {
				return row, outbox.Outcome{}, false
			}
			return row, s.finish(done, e, row, StateUnknown, 0, "the relay sending it was lost while a request was in flight: it may have been received"), true
		}
		waitedOn, waited = row, true
		select {
		case <-time.After(s.dest.Timeout + time.Second):
		case <-ctx.Done():
			return row, outage(errShutdown), true
		}
	}
}
