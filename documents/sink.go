package documents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
)

// Next is the sink documents are written through: the Elasticsearch sink
// (indexer.Sink), whose version gate decides every write.
type Next interface {
	Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error)
}

// SinkOptions configure a Sink.
type SinkOptions struct {
	Pool        *pgxpool.Pool
	Schema      string
	Next        Next
	ReadTimeout time.Duration         // statement timeout of a definition's query; default DefaultReadTimeout
	Registerer  prometheus.Registerer // optional: outboxd_document_reads_total, outboxd_document_read_ids_total
	Logger      *slog.Logger
}

// Sink is the relay's sink for an outbox with definition-fed indexes. It
// implements relay.Sink (and relay.Prober when Next does): refresh events
// are turned into the documents their definition returns now, everything
// else goes to Next unchanged, and both travel in one Next.Write.
type Sink struct {
	next   Next
	reader *Reader
	log    *slog.Logger
	reads  *prometheus.CounterVec // by index and result
	ids    *prometheus.CounterVec // ids read, by index
}

// NewSink checks o and returns a Sink.
func NewSink(o SinkOptions) (*Sink, error) {
	if o.Pool == nil || o.Next == nil {
		return nil, errors.New("documents: sink: Pool and Next are required")
	}
	r, err := NewReader(o.Pool, o.Schema, o.ReadTimeout)
	if err != nil {
		return nil, err
	}
	s := &Sink{next: o.Next, reader: r, log: o.Logger,
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_document_reads_total",
			Help: "Reads of a definition-fed index's documents (one query per index per page), by result (ok, retry, rejected).",
		}, []string{"index", "result"}),
		ids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_document_read_ids_total",
			Help: "Distinct source ids read from definitions (a page's duplicate refreshes of an id count once).",
		}, []string{"index"}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if o.Registerer != nil {
		for _, c := range []**prometheus.CounterVec{&s.reads, &s.ids} {
			if err := o.Registerer.Register(*c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, fmt.Errorf("documents: registerer: %w", err)
				}
				*c = are.ExistingCollector.(*prometheus.CounterVec)
			}
		}
	}
	return s, nil
}

// Probe asks Next, when it can be probed.
func (s *Sink) Probe(ctx context.Context) error {
	if p, ok := s.next.(interface{ Probe(context.Context) error }); ok {
		return p.Probe(ctx)
	}
	return nil
}

// Write returns one outcome per event. The refreshes of each index are
// read in one query (each id once, however often it was refreshed in the
// page, the fan-outs of query-keyed watches resolved in the same
// snapshot) and become an upsert of what the definition returned or, for
// an id it no longer returns, a delete (a tombstone), all at the read's
// version. Every refresh of an id gets the outcome of that id's write, a
// fan-out the worst outcome of the ids it resolved to.
func (s *Sink) Write(ctx context.Context, events []outbox.Event) ([]outbox.Outcome, error) {
	byIndex := map[string][]int{}
	var indexes []string
	for i := range events {
		if events[i].Op != outbox.OpRefresh {
			continue
		}
		n := events[i].IndexName
		if _, ok := byIndex[n]; !ok {
			indexes = append(indexes, n)
		}
		byIndex[n] = append(byIndex[n], i)
	}
	if len(indexes) == 0 {
		return s.next.Write(ctx, events)
	}
	out := make([]outbox.Outcome, len(events))
	settled := make([]bool, len(events))
	var batch []outbox.Event
	for i := range events {
		if events[i].Op != outbox.OpRefresh {
			batch = append(batch, events[i])
		}
	}
	var waiting []pending
	slot := map[docKey]int{} // position of each document's write in batch
	slices.Sort(indexes)
	for _, index := range indexes {
		w, err := s.readIndex(ctx, index, events, byIndex[index], &batch, slot, out, settled)
		if err != nil {
			return nil, err
		}
		waiting = append(waiting, w...)
	}
	var got []outbox.Outcome
	if len(batch) > 0 {
		var err error
		if got, err = s.next.Write(ctx, batch); err != nil {
			return nil, err
		}
		if len(got) != len(batch) {
			return nil, fmt.Errorf("documents: the sink answered %d outcomes for %d events", len(got), len(batch))
		}
	}
	j := 0
	for i := range events {
		if events[i].Op != outbox.OpRefresh {
			out[i] = got[j]
			j++
		}
	}
	for _, w := range waiting {
		o := out[w.p]
		if !settled[w.p] {
			o = outbox.Outcome{Status: outbox.Applied} // a fan-out to no document: nothing to write
		}
		for _, k := range w.docs {
			o = worse(o, got[slot[k]])
		}
		out[w.p] = o
	}
	return out, nil
}

type docKey struct{ index, id string }

// pending is a refresh whose outcome is that of the writes of docs.
type pending struct {
	p    int
	docs []docKey
}

// readIndex reads the refreshes of one index at positions, appends their
// writes to batch and returns the refreshes that wait for those writes;
// the others it settles in out.
func (s *Sink) readIndex(ctx context.Context, index string, events []outbox.Event, positions []int,
	batch *[]outbox.Event, slot map[docKey]int, out []outbox.Outcome, settled []bool) ([]pending, error) {
	var ids []string
	var fanouts []Fanout
	seen := map[string]bool{}
	fanoutAt := map[Fanout]int{}
	var direct, fanned []int
	for _, p := range positions {
		if f, ok := fanoutOf(&events[p]); ok {
			if _, ok := fanoutAt[f]; !ok {
				fanoutAt[f] = len(fanouts)
				fanouts = append(fanouts, f)
			}
			fanned = append(fanned, p)
			continue
		}
		direct = append(direct, p)
		if id := events[p].SourceID; !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	res, err := s.reader.Read(ctx, index, ids, fanouts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		o := readOutcome(err)
		s.reads.WithLabelValues(index, o.Status.String()).Inc()
		s.log.Warn("documents: reading a definition failed", "index", index, "ids", len(ids), "fanouts", len(fanouts), "outcome", o.Status.String(), "err", err)
		for _, p := range positions {
			out[p], settled[p] = o, true
		}
		return nil, nil
	}
	s.reads.WithLabelValues(index, "ok").Inc()
	for _, m := range res.Expanded {
		for _, id := range m {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	s.ids.WithLabelValues(index).Add(float64(len(ids)))
	for _, id := range ids {
		if _, ok := res.Refused[id]; ok {
			continue
		}
		e := outbox.Event{ID: events[positions[0]].ID, IndexName: index, SourceID: id, Version: res.Version, Op: outbox.OpDelete, EventType: "refresh"}
		if doc, ok := res.Docs[id]; ok {
			e.Op, e.Document = outbox.OpUpsert, doc
		}
		slot[docKey{index, id}] = len(*batch)
		*batch = append(*batch, e)
	}
	refused := func(id string) (outbox.Outcome, bool) {
		reason, ok := res.Refused[id]
		return outbox.Outcome{Status: outbox.Rejected, Reason: "documents: index " + index + ": source_id " + id + ": " + reason}, ok
	}
	var waiting []pending
	for _, p := range direct {
		if o, ok := refused(events[p].SourceID); ok {
			out[p], settled[p] = o, true
			continue
		}
		waiting = append(waiting, pending{p: p, docs: []docKey{{index, events[p].SourceID}}})
	}
	for _, p := range fanned {
		f, _ := fanoutOf(&events[p])
		got := res.Expanded[fanoutAt[f]]
		if got == nil {
			out[p], settled[p] = outbox.Outcome{Status: outbox.Rejected, Reason: fmt.Sprintf("documents: index %s: the watch of table %d is gone: nothing resolves this change", index, f.Table)}, true
			continue
		}
		w := pending{p: p}
		for _, id := range got {
			if o, ok := refused(id); ok {
				out[p], settled[p] = worse(out[p], o), true
				continue
			}
			w.docs = append(w.docs, docKey{index, id})
		}
		waiting = append(waiting, w)
	}
	return waiting, nil
}

// worse is the outcome that decides for an event standing for several
// writes: one to retry makes it retried, then one refused refuses it;
// applied and stale are both done.
func worse(a, b outbox.Outcome) outbox.Outcome {
	rank := func(o outbox.Outcome) int {
		switch o.Status {
		case outbox.Retry:
			return 3
		case outbox.Rejected:
			return 2
		case outbox.Applied, outbox.Stale:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// fanoutOf reads the changed row that refresh_watched recorded.
func fanoutOf(e *outbox.Event) (Fanout, bool) {
	if e.EventType != "refresh.watch" || len(e.Headers) == 0 {
		return Fanout{}, false
	}
	var h struct {
		Watch *uint32 `json:"outboxd_watch"`
		Row   *string `json:"row"`
	}
	if json.Unmarshal(e.Headers, &h) != nil || h.Watch == nil || h.Row == nil {
		return Fanout{}, false
	}
	return Fanout{Table: *h.Watch, Row: *h.Row}, true
}

// readOutcome is what a failed read means for its refreshes: PostgreSQL
// out of reach is an outage (retried without limit, charging nothing); a
// transient error is retried and charged; a definition that fails (or is
// gone) parks them as dead letters with the reason, to be retried once it
// is fixed.
func readOutcome(err error) outbox.Outcome {
	var re *ReadError
	if errors.As(err, &re) && re.Transient {
		return outbox.Outcome{Status: outbox.Retry, Reason: err.Error(), Outage: re.Outage}
	}
	return outbox.Outcome{Status: outbox.Rejected, Reason: err.Error()}
}
