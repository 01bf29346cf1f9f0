package relay

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/schema"
)

// Config configures a Relay. Zero values take the documented defaults.
type Config struct {
	Pool   *pgxpool.Pool
	Schema string // default "outbox"
	Sink   Sink
	// Streams this process may lead; default one stream "default" covering
	// the whole outbox. See Partitions.
	Streams []Stream

	MaxBatchDocs  int // events per page handed to the sink; default 8000
	MaxBatchBytes int // approximate bytes per page; default 4 MiB
	Prefetch      int // pages read ahead of the sink; default 2
	InFlight      int // pages at the sink at once, acknowledged in order; default 3

	MinPollInterval time.Duration // first wait after an empty poll; default 2ms
	MaxPollInterval time.Duration // longest idle wait; default 100ms
	// QuietAfter and QuietPollInterval let a stream that has read no
	// event for QuietAfter poll less often: up to QuietPollInterval
	// apart (or its own MaxPollInterval, if longer). Each poll is a round
	// trip whose wake-ups cost both processes more CPU than the query, so
	// an idle relay's cost is its polls; in exchange the first event after
	// a quiet spell waits up to QuietPollInterval (a NOTIFY wake-up, see
	// Wakeup, still reads at once). Defaults 10s and 2.5 x
	// MaxPollInterval; a QuietPollInterval at or below MaxPollInterval
	// keeps every idle wait at MaxPollInterval.
	QuietAfter        time.Duration
	QuietPollInterval time.Duration

	// Linger is how long a page that arrived at a low rate may wait for
	// more events before it goes to the sink (from its reading, or from
	// the previous page's hand-over while a trickle lasts);
	// LingerDocs is the size at which it stops waiting. Both bound what a
	// low rate costs the sink (fewer, larger writes) against latency. A
	// full page (a backlog) never waits. Defaults 60ms and 27 events: at
	// 500 events/s a page collects 27 in 54ms (under 20 writes a second),
	// while at 1,000/s its first event waits 27ms, not 60. A negative
	// Linger turns it off.
	Linger     time.Duration
	LingerDocs int

	MaxAttempts int           // transient attempts per event before dead-lettering; default 10
	BackoffBase time.Duration // default 100ms
	BackoffMax  time.Duration // default 30s

	LeaseInterval    time.Duration // how often a standby tries to take over; default 1s
	ShutdownTimeout  time.Duration // grace for in-flight writes on shutdown; default 10s
	ProgressInterval time.Duration // how often progress over empty batches is stored; default 1s
	// QuietProgressInterval replaces ProgressInterval while no stream of
	// this relay has read an event since the stream's last store: the
	// position then moved only past transactions without events, such as
	// other streams' progress stores, which would otherwise keep every
	// idle stream storing once a second for good; default 1m.
	QuietProgressInterval time.Duration
	StoreInterval         time.Duration // how often progress over delivered events is stored; default 100ms

	// Wakeup makes idle read loops wake on NOTIFY from the outbox's
	// optional trigger (see <schema>.enable_wakeup()) instead of waiting
	// out the poll interval. Polling remains the backstop.
	Wakeup bool

	Registerer prometheus.Registerer
	// Logger receives the relay's own lines; nil discards them (a library
	// never logs on its own; cmd/outboxd passes its logger).
	Logger *slog.Logger

	afterRead func(*position, int) // tests only: see export_test.go
	afterPoll func(events int)     // tests only: see export_test.go
}

func (c *Config) setDefaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.Schema == "" {
		c.Schema = schema.DefaultName
	}
	if len(c.Streams) == 0 {
		c.Streams, _ = Partitions("default", 1)
	}
	defInt(&c.MaxBatchDocs, 8000)
	defInt(&c.MaxBatchBytes, 4<<20)
	defInt(&c.Prefetch, 2)
	defInt(&c.InFlight, 3)
	defInt(&c.MaxAttempts, 10)
	if c.Linger == 0 {
		c.Linger = 60 * time.Millisecond
	}
	defInt(&c.LingerDocs, 27)
	def(&c.MinPollInterval, 2*time.Millisecond)
	def(&c.MaxPollInterval, 100*time.Millisecond)
	def(&c.QuietAfter, 10*time.Second)
	def(&c.QuietPollInterval, c.MaxPollInterval*5/2)
	def(&c.BackoffBase, 100*time.Millisecond)
	def(&c.BackoffMax, 30*time.Second)
	def(&c.LeaseInterval, time.Second)
	def(&c.ShutdownTimeout, 10*time.Second)
	def(&c.ProgressInterval, time.Second)
	def(&c.QuietProgressInterval, time.Minute)
	def(&c.StoreInterval, 100*time.Millisecond)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
