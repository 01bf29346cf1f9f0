package documents

import (
	"context"
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
// page) and become an upsert of what the definition returned or, for an
// id it no longer returns, a delete (a tombstone), all at the read's
// version; every refresh of an id gets the outcome of that id's write.
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
	var batch []outbox.Event
	var settles [][]int // batch[j]'s outcome is that of the events at settles[j]
	for i := range events {
		if events[i].Op != outbox.OpRefresh {
			batch = append(batch, events[i])
			settles = append(settles, []int{i})
		}
	}
	slices.Sort(indexes)
	for _, index := range indexes {
		positions := byIndex[index]
		ids, of := distinctIDs(events, positions)
		res, err := s.reader.Read(ctx, index, ids)
		s.ids.WithLabelValues(index).Add(float64(len(ids)))
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			o := readOutcome(err)
			s.reads.WithLabelValues(index, o.Status.String()).Inc()
			s.log.Warn("documents: reading a definition failed", "index", index, "ids", len(ids), "outcome", o.Status.String(), "err", err)
			for _, p := range positions {
				out[p] = o
			}
			continue
		}
		s.reads.WithLabelValues(index, "ok").Inc()
		for _, id := range ids {
			if reason, ok := res.Refused[id]; ok {
				for _, p := range of[id] {
					out[p] = outbox.Outcome{Status: outbox.Rejected, Reason: "documents: index " + index + ": source_id " + id + ": " + reason}
				}
				continue
			}
			e := outbox.Event{ID: events[of[id][0]].ID, IndexName: index, SourceID: id, Version: res.Version, Op: outbox.OpDelete, EventType: "refresh"}
			if doc, ok := res.Docs[id]; ok {
				e.Op, e.Document = outbox.OpUpsert, doc
			}
			batch = append(batch, e)
			settles = append(settles, of[id])
		}
	}
	if len(batch) > 0 {
		got, err := s.next.Write(ctx, batch)
		if err != nil {
			return nil, err
		}
		if len(got) != len(batch) {
			return nil, fmt.Errorf("documents: the sink answered %d outcomes for %d events", len(got), len(batch))
		}
		for j, ps := range settles {
			for _, p := range ps {
				out[p] = got[j]
			}
		}
	}
	return out, nil
}

// distinctIDs lists the source ids of positions once each, in order, and
// the positions of each.
func distinctIDs(events []outbox.Event, positions []int) ([]string, map[string][]int) {
	of := make(map[string][]int, len(positions))
	var ids []string
	for _, p := range positions {
		id := events[p].SourceID
		if _, ok := of[id]; !ok {
			ids = append(ids, id)
		}
		of[id] = append(of[id], p)
	}
	return ids, of
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
