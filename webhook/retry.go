package webhook

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// retryPoll is the longest the destination's leader goes without looking
// for due parked messages: one parked by another relay (before a
// failover) or while this one was busy is sent at most this late.
const retryPoll = time.Second

// Lead sends the destination's parked messages (state retrying) as they
// come due, until ctx ends: the relay runs it while this process leads the
// destination's stream (relay.LeaderWork), so one process at a time
// retries them. Each due message makes one attempt, under the same rules
// as a page's (the check, the rate limit, Concurrency shared with Write,
// the breaker, MaxAttempts, and the answer rule of judge), and is then
// final or parked again. Its claim is the ledger's compare-and-set on the
// attempts it read, as in Write, so a relay lost mid-request (its claim
// found in flight) never makes a second request that may be a second
// effect: a non-idempotent message becomes unknown. On return no request
// of Lead is still in flight: shutdown waits for them (they run to their
// own timeout).
func (s *Sink) Lead(ctx context.Context) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		busy = map[string]bool{} // keys this process is sending
	)
	defer wg.Wait()
	for {
		mu.Lock()
		held := make([]string, 0, len(busy))
		for k := range busy {
			held = append(held, k)
		}
		mu.Unlock()
		wait := retryPoll
		if room := s.dest.Concurrency - len(held); room > 0 {
			rows, next, err := s.ledger.due(ctx, s.dest.Name, held, room)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				s.log.Warn("webhook: cannot read the parked messages; trying again", "destination", s.dest.Name, "err", err)
			case len(rows) < room && next > 0:
				wait = min(wait, max(next, 10*time.Millisecond))
			}
			for _, p := range rows {
				select {
				case s.workers <- struct{}{}:
				case <-ctx.Done():
					return
				}
				mu.Lock()
				busy[p.e.SourceID] = true
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer func() {
						<-s.workers
						mu.Lock()
						delete(busy, p.e.SourceID)
						mu.Unlock()
						wg.Done()
						s.wakeRetries() // a slot is free, and more may be due
					}()
					out := s.send(ctx, &p.e, p.ent, 0)
					if out.Status == outbox.Retry && ctx.Err() == nil {
						s.log.Warn("webhook: parked message not retried; it stays parked", "destination", s.dest.Name,
							"dedupe_key", p.e.SourceID, "reason", out.Reason)
					}
				}()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.retryWake:
		case <-time.After(wait):
		}
	}
}

// wakeRetries makes Lead look for due messages now.
func (s *Sink) wakeRetries() {
	select {
	case s.retryWake <- struct{}{}:
	default:
	}
}

// parked is a due retrying row, as the message it holds.
type parked struct {
	e   outbox.Event
	ent entry
}

// due returns up to limit due parked messages of dest, oldest due first,
// except the keys in busy, and, when there were fewer, how long until the
// next one is due (0: none is parked).
func (l *ledger) due(ctx context.Context, dest string, busy []string, limit int) ([]parked, time.Duration, error) {
	rows, err := l.pool.Query(ctx, `SELECT dedupe_key, event_id, payload, attempts, in_flight, uncertain, check_runs FROM `+l.schema+`.deliveries
		WHERE destination = $1 AND state = 'retrying' AND next_attempt_at <= now() AND NOT dedupe_key = ANY($2)
		ORDER BY next_attempt_at LIMIT $3`, dest, busy, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("webhook: ledger: due messages of %s: %w", dest, err)
	}
	var out []parked
	for rows.Next() {
		p := parked{ent: entry{state: StateRetrying}, e: outbox.Event{IndexName: outbox.MessageIndex(dest), Op: outbox.OpUpsert}}
		if err := rows.Scan(&p.e.SourceID, &p.e.ID, &p.e.Document, &p.ent.attempts, &p.ent.inFlight, &p.ent.uncertain, &p.ent.checkRuns); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("webhook: ledger: due messages of %s: %w", dest, err)
		}
		p.ent.eventID = p.e.ID
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("webhook: ledger: due messages of %s: %w", dest, err)
	}
	if len(out) == limit {
		return out, 0, nil
	}
	var secs *float64
	if err := l.pool.QueryRow(ctx, `SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 FROM `+l.schema+`.deliveries
		WHERE destination = $1 AND state = 'retrying' AND next_attempt_at > now() AND NOT dedupe_key = ANY($2)`, dest, busy).Scan(&secs); err != nil {
		return out, 0, fmt.Errorf("webhook: ledger: next due message of %s: %w", dest, err)
	}
	if secs == nil {
		return out, 0, nil
	}
	return out, time.Duration(*secs * float64(time.Second)), nil
}
