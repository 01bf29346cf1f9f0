package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"

	"github.com/outboxd/outboxd/schema"
)

// ErrSkipped is returned by RunNow (wrapped) when another replica holds
// the job's lock, so this one did not run it.
var ErrSkipped = errors.New("skipped: another replica")

// ErrTimedOut is wrapped in the error of a run that Config.Timeout cut
// short.
var ErrTimedOut = errors.New("run timed out")

// IsSkipped reports whether err means the run was left to another replica.
func IsSkipped(err error) bool { return errors.Is(err, ErrSkipped) }

// Config configures a Scheduler.
type Config struct {
	Pool       *pgxpool.Pool
	Schema     string // default schema.DefaultName
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Location interprets 5-field schedules; default time.Local.
	Location *time.Location
	// Timeout is each run's deadline, from taking its lock to the job's
	// return: a run still going then has its context cancelled and is
	// recorded as failed. 0 means none.
	Timeout time.Duration
}

// Status is what the page and the CLI show about one job. Runs, Failures,
// LastStart, LastEnd and LastError come from job_runs, so they cover every
// replica; Running, LastTick and LastOutcome are this process's view.
type Status struct {
	Name         string     `json:"name"`
	Schedule     string     `json:"schedule"` // "" when disabled
	Next         *time.Time `json:"next,omitempty"`
	Runs         int64      `json:"runs"`
	Failures     int64      `json:"failures"`
	LastStart    *time.Time `json:"last_start,omitempty"`
	LastEnd      *time.Time `json:"last_end,omitempty"`
	LastDuration float64    `json:"last_duration_seconds"`
	LastError    string     `json:"last_error,omitempty"`
	Running      bool       `json:"running"`
	LastTick     *time.Time `json:"last_tick,omitempty"`
	LastOutcome  string     `json:"last_outcome,omitempty"` // ok, failed, skipped: another replica
}

type job struct {
	name     string
	schedule string
	fn       func(ctx context.Context) error
	entry    cron.EntryID

	mu          sync.Mutex
	running     bool
	lastTick    time.Time
	lastOutcome string
}

// Scheduler runs named jobs on cron schedules, one replica at a time.
type Scheduler struct {
	cfg     Config
	ident   string
	k1      int32
	cron    *cron.Cron
	metrics *metrics
	log     *slog.Logger

	ctx    context.Context // parent of every scheduled run; cancelled by Stop
	cancel context.CancelFunc

	mu      sync.Mutex
	jobs    map[string]*job
	started bool
	stopped bool
}

// New returns a Scheduler; Add jobs, then Start it. A schema name that is
// not a valid identifier makes every run fail with that reason.
func New(cfg Config) *Scheduler {
	if cfg.Schema == "" {
		cfg.Schema = schema.DefaultName
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Location == nil {
		cfg.Location = time.Local
	}
	ident, _ := schema.Ident(cfg.Schema)
	cl := cronLogger{cfg.Logger}
	ctx, cancel := context.WithCancel(context.Background())
	return &Scheduler{
		cfg:     cfg,
		ident:   ident,
		k1:      hash31("outboxd-jobs:" + cfg.Schema),
		cron:    cron.New(cron.WithLocation(cfg.Location), cron.WithLogger(cl), cron.WithChain(cron.Recover(cl), cron.SkipIfStillRunning(cl))),
		metrics: newMetrics(cfg.Registerer),
		log:     cfg.Logger,
		ctx:     ctx,
		cancel:  cancel,
		jobs:    map[string]*job{},
	}
}

// Add registers fn under name with a cron schedule: five fields or a
// descriptor such as "@every 1m". An empty schedule registers the job
// disabled (it shows in Status and RunNow still runs it).
func (s *Scheduler) Add(name, schedule string, fn func(ctx context.Context) error) error {
	schedule = strings.TrimSpace(schedule)
	switch {
	case strings.TrimSpace(name) == "":
		return errors.New("jobs: add: name: must not be empty")
	case fn == nil:
		return fmt.Errorf("jobs: add %q: fn: must not be nil", name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.jobs[name]; dup {
		return fmt.Errorf("jobs: add %q: a job with that name is already added", name)
	}
	j := &job{name: name, schedule: schedule, fn: fn}
	if schedule != "" {
		sched, err := cron.ParseStandard(schedule)
		if err != nil {
			return fmt.Errorf("jobs: job %q: schedule %q: %v (want 5 cron fields like \"15 3 * * *\", or \"@every 1m\", or empty to disable)", name, schedule, err)
		}
		// Schedule wraps the job in the cron's chain: Recover, then
		// SkipIfStillRunning.
		j.entry = s.cron.Schedule(sched, cron.FuncJob(func() { _ = s.run(s.ctx, j) }))
	}
	s.jobs[name] = j
	return nil
}

// Start begins running jobs on their schedules. It is a no-op after the
// first call.
func (s *Scheduler) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return
	}
	s.started = true
	s.cron.Start()
}

// Stop stops scheduling, cancels running jobs' context and waits for them
// to return, or for ctx to end (then it returns ctx's error).
func (s *Scheduler) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	done := s.cron.Stop()
	s.cancel()
	select {
	case <-done.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("jobs: stop: jobs still running: %w", ctx.Err())
	}
}

// RunNow runs the named job at once, under the same lock as a scheduled
// run, and returns its error; IsSkipped(err) when another replica holds
// the lock.
func (s *Scheduler) RunNow(ctx context.Context, name string) error {
	s.mu.Lock()
	j, ok := s.jobs[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("jobs: run %q: no such job", name)
	}
	return s.run(ctx, j)
}

// Status lists every job in name order. It reads job_runs with a short
// timeout; if that fails, it still returns what this process knows.
func (s *Scheduler) Status() []Status {
	s.mu.Lock()
	jobs := make([]*job, 0, len(s.jobs))
	for _, j := range s.jobs {
		jobs = append(jobs, j)
	}
	s.mu.Unlock()
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].name < jobs[b].name })

	recorded := map[string]Status{}
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	if err := s.readRuns(ctx, recorded); err != nil && s.ctx.Err() == nil {
		s.log.Warn("jobs: cannot read job_runs", "err", err)
	}
	out := make([]Status, 0, len(jobs))
	for _, j := range jobs {
		st := recorded[j.name]
		st.Name, st.Schedule = j.name, j.schedule
		if j.entry != 0 {
			if next := s.cron.Entry(j.entry).Next; !next.IsZero() {
				st.Next = &next
			}
		}
		j.mu.Lock()
		st.Running = j.running
		if !j.lastTick.IsZero() {
			t := j.lastTick
			st.LastTick = &t
		}
		st.LastOutcome = j.lastOutcome
		j.mu.Unlock()
		out = append(out, st)
	}
	return out
}

func (s *Scheduler) readRuns(ctx context.Context, into map[string]Status) error {
	if s.ident == "" || s.cfg.Pool == nil {
		return nil
	}
	rows, err := s.cfg.Pool.Query(ctx, `SELECT job, runs, failures, last_start, last_end, coalesce(last_error, ''),
		CASE WHEN last_end >= last_start THEN extract(epoch FROM last_end - last_start)::float8 ELSE 0 END
		FROM `+s.ident+`.job_runs`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var st Status
		if err := rows.Scan(&st.Name, &st.Runs, &st.Failures, &st.LastStart, &st.LastEnd, &st.LastError, &st.LastDuration); err != nil {
			return err
		}
		into[st.Name] = st
	}
	return rows.Err()
}

func (j *job) tick(outcome string, running bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if running {
		j.lastTick = time.Now()
	}
	j.running = running
	if outcome != "" {
		j.lastOutcome = outcome
	}
}

// call runs fn, turning a panic into an error so the run is recorded as a
// failure and the lock is released normally.
func call(ctx context.Context, fn func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return fn(ctx)
}
