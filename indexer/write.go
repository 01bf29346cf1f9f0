package indexer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/outboxd/outboxd/outbox"
)

// write is the state of one Write call.
type write struct {
	events        []outbox.Event
	out           []outbox.Outcome
	deletedAt     string
	sourceOnError bool // the server takes include_source_on_error

	probeMu sync.Mutex
	probed  probeResult

	mu        sync.Mutex
	reached   bool   // some request got an answer from Elasticsearch
	unreached error  // the last request that did not
	refused   error  // even the probe refused for the sink's own fault
	equal     []int  // strict-external conflicts at the event's own version (see gate.go)
	resent    []bool // by position: re-sent with external_gte in this Write
	missing   map[string]bool
}

func (w *write) answered() {
	w.mu.Lock()
	w.reached = true
	w.mu.Unlock()
}

func (w *write) unreachable(err error) {
	w.mu.Lock()
	w.unreached = err
	w.mu.Unlock()
}

// Write sends events as bulk requests, several in flight, and returns one
// Outcome per event, in order. It returns an *UnavailableError, and no
// outcomes, when no request reached Elasticsearch, and a *ConfigError when
// Elasticsearch refuses the sink's requests whatever they carry.
func (s *Sink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	v, err := s.version(ctx)
	if err != nil {
		return nil, err
	}
	w := &write{
		events:        events,
		out:           make([]outbox.Outcome, len(events)),
		deletedAt:     s.now().UTC().Format("2006-01-02T15:04:05.000Z"),
		sourceOnError: v.sourceOnErrorParam(),
	}
	pending := s.admit(ctx, w)
	for len(pending) > 0 {
		winners, winnerOf := dedupe(events, pending)
		s.apply(ctx, w, winners)
		var again []int
		for i, p := range pending {
			win := winnerOf[i]
			if win == p {
				continue
			}
			switch o := w.out[win]; o.Status {
			case outbox.Applied:
				w.out[p] = outbox.Outcome{Status: outbox.Stale}
			case outbox.Rejected:
				// The newer version will never land, so this one is not
				// superseded: send it in its own right.
				again = append(again, p)
			default:
				w.out[p] = o
			}
		}
		pending = again
	}
	for name := range w.missing {
		s.logger.Warn("indexer: the write alias of an index is missing; its events wait while it is bootstrapped again",
			slog.String("index", name), slog.String("alias", WriteAlias(name)))
		s.forget(name)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if w.refused != nil {
		s.forgetVersion() // the server may have been replaced by an older one
		return nil, &ConfigError{Err: w.refused}
	}
	if !w.reached && w.unreached != nil {
		return nil, &UnavailableError{Err: w.unreached}
	}
	return w.out, nil
}

// admit rejects malformed events, bootstraps every index name once and
// returns the positions still to send.
func (s *Sink) admit(ctx context.Context, w *write) []int {
	pending := make([]int, 0, len(w.events))
	var failed map[string]outbox.Outcome
	for i := range w.events {
		e := &w.events[i]
		if reason := checkEvent(e, s.jsonb); reason != "" {
			w.out[i] = outbox.Outcome{Status: outbox.Rejected, Reason: reason}
			continue
		}
		if o, ok := failed[e.IndexName]; ok {
			w.out[i] = o
			continue
		}
		if err := s.ensure(ctx, e.IndexName); err != nil {
			if failed == nil {
				failed = make(map[string]outbox.Outcome)
			}
			o := bootstrapOutcome(w, err)
			failed[e.IndexName] = o
			w.out[i] = o
			continue
		}
		pending = append(pending, i)
	}
	return pending
}

func bootstrapOutcome(w *write, err error) outbox.Outcome {
	var re *ResponseError
	var ne *NameError
	var lost *LayoutLostError
	switch {
	case errors.As(err, &lost):
		// Every event of the index shares it: pause until the aliases are
		// back, dead-lettering nothing.
		w.answered()
		w.mu.Lock()
		w.refused = err
		w.mu.Unlock()
		return outbox.Outcome{Status: outbox.Retry, Reason: err.Error(), Outage: true}
	case IsIncompatible(err), errors.As(err, &ne):
		w.answered()
		return outbox.Outcome{Status: outbox.Rejected, Reason: err.Error()}
	case errors.As(err, &re):
		w.answered()
		if re.Status == http.StatusBadRequest && re.Type == "invalid_index_name_exception" {
			return outbox.Outcome{Status: outbox.Rejected, Reason: err.Error()}
		}
		if re.Status != 408 && re.Status != 429 && re.Status < 500 {
			// An index spec the server will not create, a shard limit,
			// credentials, a proxy path: the configuration's fault, and
			// every event of the index would share it.
			w.mu.Lock()
			w.refused = err
			w.mu.Unlock()
		}
		return outbox.Outcome{Status: outbox.Retry, Reason: err.Error(), Outage: true}
	}
	w.unreachable(err)
	return outbox.Outcome{Status: outbox.Retry, Reason: err.Error(), Outage: true}
}

// checkEvent returns why e can never be indexed, or "". validJSON skips
// parsing a document known to be valid JSON.
func checkEvent(e *outbox.Event, validJSON bool) string {
	switch {
	case e.SourceID == "":
		return "source_id: must not be empty"
	case len(e.SourceID) > 512:
		return fmt.Sprintf("source_id: Elasticsearch ids are at most 512 bytes, got %d", len(e.SourceID))
	case e.Version < 1:
		return fmt.Sprintf("version: must be >= 1, got %d", e.Version)
	case e.Op == outbox.OpUpsert:
		return checkDocument(e.Document, validJSON)
	case e.Op == outbox.OpDelete:
		return ""
	}
	return fmt.Sprintf("op: must be %q or %q, got %q", outbox.OpUpsert, outbox.OpDelete, e.Op)
}

type docKey struct{ index, id string }

// dedupe keeps, per document, the highest version; on equal versions the
// later event, so the later write wins as it would if sent one by one.
// winners are in pending's order; winnerOf[i] is the winner for
// pending[i]. Each event's key is hashed once or twice (a new key is
// looked up, then inserted): at a backlog's rates the hashing was a tenth
// of the relay's CPU when done four times.
func dedupe(events []outbox.Event, pending []int) (winners, winnerOf []int) {
	slot := make(map[docKey]int, len(pending)) // document -> index into best
	best := make([]int, 0, len(pending))       // each document's winner so far
	winnerOf = make([]int, len(pending))       // first pending[i]'s index into best, then its winner
	for i, p := range pending {
		k := docKey{events[p].IndexName, events[p].SourceID}
		j, ok := slot[k]
		if !ok {
			j = len(best)
			slot[k] = j
			best = append(best, p)
		} else if events[p].Version >= events[best[j]].Version {
			best[j] = p
		}
		winnerOf[i] = j
	}
	winners = make([]int, 0, len(best))
	for i, p := range pending {
		winnerOf[i] = best[winnerOf[i]]
		if winnerOf[i] == p {
			winners = append(winners, p)
		}
	}
	return winners, winnerOf
}
