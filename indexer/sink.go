package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
)

// Options configure a Sink.
type Options struct {
	Client        *elasticsearch.Client
	MaxBatchDocs  int                   // per bulk request, default 1000
	MaxBatchBytes int                   // per bulk request, default 5 MiB
	Workers       int                   // bulk requests in flight, default 4
	IndexSpec     []byte                // optional {"settings":...,"mappings":...} for Bootstrap
	Registerer    prometheus.Registerer // optional; outboxd_bulk_request_seconds{result}
	Logger        *slog.Logger

	// JSONB says every document PostgreSQL produced from a json or jsonb
	// value, so it is valid JSON, and the sink does not parse it again (it
	// still checks for an object and reserved fields, and folds one with
	// newlines onto a line). The
	// relay's documents come from outbox.events (jsonb); a backfill's from
	// its query's document column (see backfill.ValidJSON). It is the one
	// such switch: see "Documents PostgreSQL validated" in the package doc.
	JSONB bool

	// Rebuilt, when set, names the concrete index a recorded rebuild left
	// an index's documents in ("" when none is recorded, or it is
	// name-000001). Bootstrap then refuses to create an empty
	// name-000001 for an index whose recorded home is another one, even
	// when that index is gone: a layout never silently starts over.
	Rebuilt func(ctx context.Context, name string) (string, error)
}

// Sink writes relay events to Elasticsearch. It implements relay.Sink.
type Sink struct {
	es       *elasticsearch.Client
	maxDocs  int
	maxBytes int
	workers  int
	spec     []byte
	jsonb    bool
	rebuilt  func(ctx context.Context, name string) (string, error)
	logger   *slog.Logger
	latency  *prometheus.HistogramVec
	now      func() time.Time // tombstone timestamps; tests move it

	mu   sync.Mutex
	boot map[string]*bootEntry

	verMu chan struct{} // a lock a waiting Write can give up on at its deadline
	ver   serverVersion // zero until detected
}

type bootEntry struct {
	lock chan struct{} // one bootstrap at a time; a channel, so waiting for it honours ctx
	ok   atomic.Bool
	// wasOK: bootstrapped before in this process, so creating the index
	// now re-creates a layout that vanished (guarded by lock).
	wasOK bool
}

// NewSink checks o and returns a Sink. It does not contact Elasticsearch:
// indices are bootstrapped on first use.
func NewSink(o Options) (*Sink, error) {
	if o.Client == nil {
		return nil, errors.New("indexer: client: is nil")
	}
	if o.MaxBatchDocs < 0 || o.MaxBatchBytes < 0 || o.Workers < 0 {
		return nil, fmt.Errorf("indexer: max_batch_docs, max_batch_bytes, workers: must not be negative (got %d, %d, %d)", o.MaxBatchDocs, o.MaxBatchBytes, o.Workers)
	}
	spec, err := indexBody(o.IndexSpec)
	if err != nil {
		return nil, err
	}
	s := &Sink{
		es:       o.Client,
		maxDocs:  orDefault(o.MaxBatchDocs, 1000),
		maxBytes: orDefault(o.MaxBatchBytes, 5<<20),
		workers:  orDefault(o.Workers, 4),
		spec:     spec,
		jsonb:    o.JSONB,
		rebuilt:  o.Rebuilt,
		logger:   o.Logger,
		boot:     make(map[string]*bootEntry),
		verMu:    make(chan struct{}, 1),
		now:      time.Now,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outboxd_bulk_request_seconds",
			Help:    "Latency of bulk requests to Elasticsearch, by result (ok, item_errors, http_error, unreachable).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}, []string{"result"}),
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(s.latency); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, fmt.Errorf("indexer: registerer: %w", err)
			}
			s.latency = are.ExistingCollector.(*prometheus.HistogramVec)
		}
	}
	return s, nil
}

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

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
		for _, p := range pending {
			win := winnerOf(p)
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
func dedupe(events []outbox.Event, pending []int) (winners []int, winnerOf func(int) int) {
	best := make(map[docKey]int, len(pending))
	for _, p := range pending {
		k := docKey{events[p].IndexName, events[p].SourceID}
		if b, ok := best[k]; !ok || events[p].Version >= events[b].Version {
			best[k] = p
		}
	}
	winners = make([]int, 0, len(best))
	for _, p := range pending {
		if best[docKey{events[p].IndexName, events[p].SourceID}] == p {
			winners = append(winners, p)
		}
	}
	return winners, func(p int) int { return best[docKey{events[p].IndexName, events[p].SourceID}] }
}

// sendAll splits items into bulk requests bounded by count and bytes and
// runs up to s.workers of them at once.
func (s *Sink) sendAll(ctx context.Context, w *write, items []int, vt versionType) {
	// Spread a page over the workers (down to 100 events a request) so a
	// relay page smaller than workers*MaxBatchDocs still keeps every
	// worker busy.
	perChunk := min(s.maxDocs, max(100, (len(items)+s.workers-1)/s.workers))
	var chunks [][]int
	start, size := 0, 0
	for i, p := range items {
		n := approxSize(&w.events[p])
		if i > start && (i-start >= perChunk || size+n > s.maxBytes) {
			chunks = append(chunks, items[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(items) {
		chunks = append(chunks, items[start:])
	}
	if len(chunks) == 1 {
		s.send(ctx, w, chunks[0], vt)
		return
	}
	next := make(chan []int)
	var wg sync.WaitGroup
	for range min(s.workers, len(chunks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				s.send(ctx, w, c, vt)
			}
		}()
	}
	for _, c := range chunks {
		next <- c
	}
	close(next)
	wg.Wait()
}

func approxSize(e *outbox.Event) int {
	return 110 + 2*len(e.IndexName) + len(e.SourceID) + len(e.Document)
}

var (
	ptrTrue  = true
	ptrFalse = false
)

// send runs one bulk request and settles the outcome of each of its items.
func (s *Sink) send(ctx context.Context, w *write, items []int, vt versionType) {
	bp := getBody()
	defer putBody(bp)
	b := (*bp)[:0]
	for _, p := range items {
		e := &w.events[p]
		b = appendAction(b, e.IndexName, e.SourceID, e.Version, vt)
		if e.Op == outbox.OpDelete {
			b = appendTombstone(b, w.deletedAt)
		} else {
			b = append(b, oneLine(e.Document)...)
		}
		b = append(b, '\n')
	}
	*bp = b
	if len(b) > s.maxBytes && len(items) > 1 {
		// sendAll's estimate fell short (escaped ids, tombstones): the cap
		// is a promise to proxies and http.max_content_length, keep it.
		h := len(items) / 2
		s.send(ctx, w, items[:h], vt)
		s.send(ctx, w, items[h:], vt)
		return
	}

	started := time.Now()
	req := esapi.BulkRequest{
		Body:         bytes.NewReader(b),
		FilterPath:   bulkFilterPath,
		RequireAlias: &ptrTrue, // never auto-create a concrete index named like the alias
	}
	if w.sourceOnError {
		// Documents may hold personal data; keep them out of reasons and
		// logs. Servers before 8.18 refuse the parameter (and do not add
		// the source to errors).
		req.IncludeSourceOnError = &ptrFalse
	}
	res, err := req.Do(ctx, s.es)
	if err != nil {
		s.observe("unreachable", started)
		s.failed(ctx, w, items, vt, requestFailure{err: fmt.Errorf("bulk request: %w", err)})
		return
	}
	rb := getBody()
	defer putBody(rb)
	body, err := readAll(res, rb)
	switch {
	case err != nil:
		s.observe("unreachable", started)
		s.failed(ctx, w, items, vt, requestFailure{err: fmt.Errorf("bulk response: %w", err)})
	case res.StatusCode == http.StatusOK:
		w.answered()
		if allSucceeded(body) {
			s.observe("ok", started)
			s.settleAll(w, items, outbox.Outcome{Status: outbox.Applied})
			return
		}
		s.observe("item_errors", started)
		s.settleItems(w, items, body)
	default:
		s.observe("http_error", started)
		s.failed(ctx, w, items, vt, requestFailure{status: res.StatusCode, err: responseError("bulk", res.StatusCode, body)})
	}
}

func (s *Sink) settleAll(w *write, items []int, o outbox.Outcome) {
	for _, p := range items {
		w.out[p] = o
	}
}

func (s *Sink) settleItems(w *write, items []int, body []byte) {
	var r bulkResponse
	if err := json.Unmarshal(body, &r); err != nil || len(r.Items) != len(items) {
		reason := fmt.Sprintf("bulk response: expected %d items, could not read them", len(items))
		if err != nil {
			reason += ": " + err.Error()
		}
		s.settleAll(w, items, outbox.Outcome{Status: outbox.Retry, Reason: reason})
		return
	}
	for i, p := range items {
		c, reason := classify(&r.Items[i].Index)
		switch c {
		case classConflict:
			w.conflict(p, reason)
			continue
		case classMissingAlias:
			w.mu.Lock()
			if w.missing == nil {
				w.missing = make(map[string]bool)
			}
			w.missing[w.events[p].IndexName] = true
			w.mu.Unlock()
		}
		w.out[p] = outcomeOf(c, reason)
	}
}

func (s *Sink) observe(result string, started time.Time) {
	s.latency.WithLabelValues(result).Observe(time.Since(started).Seconds())
}

// Probe succeeds once the cluster answers with every primary shard
// active (health yellow or green): the relay calls it during an outage to
// resume delivery within a second of the cluster coming back, and a node
// that answers while it still recovers its shards would only refuse the
// retried page with 503 (see relay.Prober).
func (s *Sink) Probe(ctx context.Context) error {
	return probeHealthy(ctx, s.es)
}

// probeHealthy asks for cluster health yellow or better without waiting for
// it: a cluster that is not there yet answers 408 at once, an error.
func probeHealthy(ctx context.Context, es *elasticsearch.Client) error {
	_, err := perform(ctx, es, "probe", esapi.ClusterHealthRequest{
		WaitForStatus: "yellow", Timeout: 100 * time.Millisecond, FilterPath: []string{"status"},
	})
	return err
}
