package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
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

	// Linger is how long a page that arrived at a low rate may wait,
	// from its reading, for more events before it goes to the sink;
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
	StoreInterval    time.Duration // how often progress over delivered events is stored; default 100ms

	// Wakeup makes idle read loops wake on NOTIFY from the outbox's
	// optional trigger (see <schema>.enable_wakeup()) instead of waiting
	// out the poll interval. Polling remains the backstop.
	Wakeup bool

	Registerer prometheus.Registerer
	// Logger receives the relay's own lines; nil discards them (a library
	// never logs on its own; cmd/outboxd passes its logger).
	Logger *slog.Logger
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
	def(&c.BackoffBase, 100*time.Millisecond)
	def(&c.BackoffMax, 30*time.Second)
	def(&c.LeaseInterval, time.Second)
	def(&c.ShutdownTimeout, 10*time.Second)
	def(&c.ProgressInterval, time.Second)
	def(&c.StoreInterval, 100*time.Millisecond)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Relay streams committed outbox events to a Sink. See the package doc.
type Relay struct {
	cfg     Config
	schema  string // quoted
	member  int64  // advisory key of the relays' membership
	metrics *metrics
	log     *slog.Logger

	waker waker

	mu           sync.Mutex
	held         map[string]context.CancelFunc // streams this process leads
	paused       map[string]string             // stream -> why its sink fails; see Paused
	reconnecting map[string]error              // see Health
	unled        map[string]time.Time          // stream -> first seen without a leader; see Leaderless
	standing     map[string]int                // stream -> pid of the session standing by for it

	fleet fleet // which live relays can lead which streams; see look
}

// New checks cfg and returns a Relay; Run starts it.
func New(cfg Config) (*Relay, error) {
	cfg.setDefaults()
	if cfg.Pool == nil {
		return nil, errors.New("relay: config: Pool is required")
	}
	id, err := schema.Ident(cfg.Schema)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, s := range cfg.Streams {
		switch {
		case s.Name == "":
			return nil, errors.New("relay: config: streams: a stream needs a name")
		case seen[s.Name]:
			return nil, fmt.Errorf("relay: config: streams: %q listed twice", s.Name)
		case s.BucketLo < 0 || s.BucketHi > 1023 || s.BucketLo > s.BucketHi:
			return nil, fmt.Errorf("relay: config: streams: %q: bucket range %d..%d is not within 0..1023", s.Name, s.BucketLo, s.BucketHi)
		case s.Sink == nil && cfg.Sink == nil:
			return nil, fmt.Errorf("relay: config: Sink is required (stream %q has none of its own)", s.Name)
		}
		seen[s.Name] = true
	}
	r := &Relay{
		cfg:     cfg,
		schema:  id,
		member:  memberKey(cfg.Schema),
		metrics: newMetrics(cfg.Registerer),
		log:     cfg.Logger,
		held:    map[string]context.CancelFunc{},
	}
	for _, s := range cfg.Streams {
		r.metrics.leader.WithLabelValues(s.Name).Set(0)
	}
	return r, nil
}

// Leading lists the streams this process currently leads.
func (r *Relay) Leading() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.held))
	for s := range r.held {
		out = append(out, s)
	}
	return out
}

// Streams lists the streams this relay may lead.
func (r *Relay) Streams() []Stream { return r.cfg.Streams }

// Run leads whichever streams it can until ctx is cancelled, then shuts
// down gracefully: it stops reading, lets in-flight writes finish within
// ShutdownTimeout and persists progress. It returns nil after a graceful
// shutdown and an error only for what reconnecting cannot fix (see fatal;
// e.g. a *PositionError): lost connections, at start or later, and failed
// progress writes are retried.
func (r *Relay) Run(ctx context.Context) error {
	member := &membership{r: r}
	if err := r.joinWithRetry(ctx, member); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer member.close(ctx)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	if r.cfg.Wakeup {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(ctx)
		}()
	}
	for _, s := range r.cfg.Streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.contend(ctx, member, s); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (r *Relay) connect(ctx context.Context) (*pgx.Conn, error) {
	cc := r.cfg.Pool.Config().ConnConfig.Copy()
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("relay: connect: %w", err)
	}
	return conn, nil
}

// leadingCount counts the streams this process leads.
func (r *Relay) leadingCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// setStanding records the backend pid of the session standing by for
// stream (0: none), so that this relay does not count itself as its own
// standby.
func (r *Relay) setStanding(stream string, pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.standing == nil {
		r.standing = map[string]int{}
	}
	if pid == 0 {
		delete(r.standing, stream)
		return
	}
	r.standing[stream] = pid
}

func (r *Relay) standingPIDs() []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []int32{}
	for _, pid := range r.standing {
		out = append(out, int32(pid))
	}
	return out
}

// contend stands by for stream s while this process has room for it, and
// leads it whenever it can take the lock; without room it takes the
// stream only when nobody else does (see balance.go).
func (r *Relay) contend(ctx context.Context, member *membership, s Stream) error {
	key := streamKey(r.cfg.Schema, s.Name)
	standbyLock := standbyKey(r.cfg.Schema, s.Name)
	var conn *pgx.Conn
	standing := false  // conn holds the stream's standby lock
	failures := 0      // connection failures since the last lock attempt that got an answer
	ledBefore := false // a leadership of s ended without a fatal error in this process
	drop := func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
		}
		if standing {
			standing = false
			r.setStanding(s.Name, 0)
		}
	}
	defer drop()
	for {
		l := r.look(ctx, member)
		room := l.room(s.Name, r.leadingCount())
		rescue := !room && l.rescue(s.Name, r.cfg.LeaseInterval)
		if !room && !rescue {
			r.setReconnecting(s.Name, nil)
		}
		if conn != nil && (conn.IsClosed() || (standing && !room) || (!room && !rescue)) {
			// Without room this process does not stand by for the stream:
			// holding a connection for it would only use up the server's,
			// and its standby lock would invite a hand-over it would not
			// take. A closed session took its standby lock with it.
			drop()
		}
		if room || rescue {
			if conn == nil {
				c, err := r.connect(ctx)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					r.log.Warn("relay: cannot connect; will retry", "stream", s.Name, "err", err)
					r.setReconnecting(s.Name, err)
					failures++
				}
				conn = c
			}
			if conn != nil && room && !standing {
				if err := standBy(ctx, conn, standbyLock); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					r.log.Warn("relay: cannot stand by for the stream; will retry", "stream", s.Name, "err", err)
					drop()
					r.setReconnecting(s.Name, err)
					failures++
				} else {
					standing = true
					r.setStanding(s.Name, int(conn.PgConn().PID()))
				}
			}
			if conn != nil {
				ok, err := tryLead(ctx, conn, key, standbyLock, standing)
				switch {
				case err != nil && ctx.Err() == nil:
					r.log.Warn("relay: lock attempt failed; will retry", "stream", s.Name, "err", err)
					drop()
					r.setReconnecting(s.Name, err)
					failures++
				case ok:
					if standing {
						standing = false
						r.setStanding(s.Name, 0)
					}
					r.setReconnecting(s.Name, nil)
					failures = 0
					if rescue {
						r.log.Info("relay: leading a stream nobody led or stood by for, beyond this relay's share", "stream", s.Name)
					}
					err := r.lead(ctx, member, conn, s)
					lost := sessionLost(conn, err)
					// Closing the session is what releases the lock: the
					// stream is given up, whatever ended its leadership.
					drop()
					// A lost session or a failed step (a progress write
					// above all) is healed by contending again from the
					// stored position, except on shutdown, where the
					// unstored position is reported, and for what a new
					// leadership would meet again.
					if err != nil && (ctx.Err() != nil || (fatal(err) && !ledBefore)) {
						return err
					}
					if err != nil && fatal(err) {
						// Met while the relay runs (after a database
						// failover, say): that stream stops, shown with
						// its reason, and the others go on; it is tried
						// again after a pause, in case an operator reset it.
						r.log.Error("relay: the stream cannot go on; the other streams continue", "stream", s.Name, "err", err)
						r.setReconnecting(s.Name, err)
						select {
						case <-ctx.Done():
							return nil
						case <-time.After(30 * r.cfg.LeaseInterval):
						}
						continue
					}
					ledBefore = true
					if err != nil {
						if lost {
							r.log.Warn("relay: lost the stream's database session; reconnecting", "stream", s.Name, "err", err)
						} else {
							r.log.Warn("relay: gave up the stream after a failed step; contending for it again", "stream", s.Name, "err", err)
						}
						r.setReconnecting(s.Name, err)
						failures++
					}
				default:
					r.setReconnecting(s.Name, nil)
					failures = 0
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.retryWait(failures)):
		}
	}
}

// lead runs stream s while this process holds its lock. It returns nil on
// shutdown or when handing the stream to another relay for balance.
func (r *Relay) lead(ctx context.Context, member *membership, conn *pgx.Conn, s Stream) error {
	ctx, yield := context.WithCancel(ctx)
	defer yield()
	r.mu.Lock()
	r.held[s.Name] = yield
	r.mu.Unlock()
	r.metrics.leader.WithLabelValues(s.Name).Set(1)
	defer func() {
		r.mu.Lock()
		delete(r.held, s.Name)
		delete(r.paused, s.Name)
		r.mu.Unlock()
		r.metrics.leader.WithLabelValues(s.Name).Set(0)
	}()

	pos, err := loadProgress(ctx, conn, r.schema, s)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.log.Info("relay: leading stream", "stream", s.Name, "position", pos.done.String())
	w := &streamWriter{r: r, member: member, conn: conn, stream: s, acked: pos, stored: time.Now()}
	if lw, ok := w.sink().(LeaderWork); ok {
		// The stream may be led again as soon as this returns: the sink's
		// own work of this term must be over by then, like its pages.
		var work sync.WaitGroup
		work.Add(1)
		go func() {
			defer work.Done()
			lw.Lead(ctx)
		}()
		defer func() {
			yield()
			work.Wait()
		}()
	}
	return w.run(ctx)
}
