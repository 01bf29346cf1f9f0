package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/schema"
)

// Relay streams committed outbox events to a Sink. See the package doc.
type Relay struct {
	cfg     Config
	schema  string // quoted
	member  int64  // advisory key of the relays' membership
	metrics *metrics
	log     *slog.Logger

	waker waker

	// eventsRead counts the events every stream of this relay has read; a
	// stream whose position moved only by empty pages stores it sooner
	// when the count moved (see streamWriter.storeDue).
	eventsRead atomic.Int64

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
		case s.MaxBatchBytes < 0:
			return nil, fmt.Errorf("relay: config: streams: %q: MaxBatchBytes must be >= 0 (0 takes Config.MaxBatchBytes), got %d", s.Name, s.MaxBatchBytes)
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

// lead runs stream s while this process holds its lock. It returns nil on
// shutdown or when handing the stream to another relay for balance.
func (r *Relay) lead(ctx context.Context, member *membership, conn *pgx.Conn, s Stream) error {
	ctx, yield := context.WithCancel(ctx)
	defer yield()
	// The gauge changes inside the lock that Leading reads under, so the
	// two never disagree.
	r.mu.Lock()
	r.held[s.Name] = yield
	r.metrics.leader.WithLabelValues(s.Name).Set(1)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.held, s.Name)
		delete(r.paused, s.Name)
		r.metrics.leader.WithLabelValues(s.Name).Set(0)
		r.mu.Unlock()
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
