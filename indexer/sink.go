package indexer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
	"github.com/prometheus/client_golang/prometheus"
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
