package jobs_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/schema/schematest"
)

type testEnv struct {
	pool   *pgxpool.Pool
	schema string
}

func setup(t *testing.T) *testEnv {
	t.Helper()
	pool, name := schematest.Setup(t)
	return &testEnv{pool: pool, schema: name}
}

func (e *testEnv) scheduler(t *testing.T, reg prometheus.Registerer) *jobs.Scheduler {
	t.Helper()
	s := jobs.New(jobs.Config{Pool: e.pool, Schema: e.schema, Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return s
}

func (e *testEnv) recorded(t *testing.T, job string) (runs, failures int64, lastErr string) {
	t.Helper()
	err := e.pool.QueryRow(context.Background(), `SELECT runs, failures, coalesce(last_error, '') FROM "`+e.schema+`".job_runs WHERE job = $1`, job).
		Scan(&runs, &failures, &lastErr)
	if err != nil {
		t.Fatalf("read job_runs for %s: %v", job, err)
	}
	return runs, failures, lastErr
}

func TestJobsAdd(t *testing.T) {
	t.Parallel()
	s := jobs.New(jobs.Config{Schema: "outbox"})
	noop := func(context.Context) error { return nil }

	t.Run("a bad schedule is refused naming the job and the schedule", func(t *testing.T) {
		err := s.Add("retention", "every minute", noop)
		if err == nil || !strings.Contains(err.Error(), `"retention"`) || !strings.Contains(err.Error(), `"every minute"`) {
			t.Fatalf("err = %v, want one naming the job and the schedule", err)
		}
	})
	t.Run("five fields and @every are accepted", func(t *testing.T) {
		if err := s.Add("a", "15 3 * * *", noop); err != nil {
			t.Fatal(err)
		}
		if err := s.Add("b", "@every 1m", noop); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("an empty schedule adds the job disabled", func(t *testing.T) {
		if err := s.Add("c", "", noop); err != nil {
			t.Fatal(err)
		}
		for _, st := range s.Status() {
			if st.Name == "c" && (st.Schedule != "" || st.Next != nil) {
				t.Fatalf("disabled job status = %+v", st)
			}
		}
	})
	t.Run("a name is used once", func(t *testing.T) {
		if err := s.Add("a", "@hourly", noop); err == nil {
			t.Fatal("duplicate name accepted")
		}
	})
}

func TestJobsRunNow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	s := e.scheduler(t, reg)
	ctx := context.Background()

	t.Run("a successful run is recorded in job_runs and metrics", func(t *testing.T) {
		if err := s.Add("ok", "", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := s.RunNow(ctx, "ok"); err != nil {
			t.Fatal(err)
		}
		runs, failures, lastErr := e.recorded(t, "ok")
		if runs != 1 || failures != 0 || lastErr != "" {
			t.Fatalf("job_runs = %d runs, %d failures, %q", runs, failures, lastErr)
		}
		if got := counter(t, reg, "outboxd_job_runs_total", "ok"); got != 1 {
			t.Fatalf("outboxd_job_runs_total{job=ok} = %v", got)
		}
	})
	t.Run("a failing run records its error", func(t *testing.T) {
		if err := s.Add("bad", "", func(context.Context) error { return errors.New("disk on fire") }); err != nil {
			t.Fatal(err)
		}
		if err := s.RunNow(ctx, "bad"); err == nil || !strings.Contains(err.Error(), "disk on fire") {
			t.Fatalf("err = %v", err)
		}
		runs, failures, lastErr := e.recorded(t, "bad")
		if runs != 1 || failures != 1 || lastErr != "disk on fire" {
			t.Fatalf("job_runs = %d runs, %d failures, %q", runs, failures, lastErr)
		}
		st := find(t, s.Status(), "bad")
		if st.LastOutcome != "failed" || st.Failures != 1 || st.LastError != "disk on fire" {
			t.Fatalf("status = %+v", st)
		}
	})
	t.Run("a panic is recovered and recorded as a failure", func(t *testing.T) {
		if err := s.Add("panics", "", func(context.Context) error { panic("boom") }); err != nil {
			t.Fatal(err)
		}
		if err := s.RunNow(ctx, "panics"); err == nil || !strings.Contains(err.Error(), "panic: boom") {
			t.Fatalf("err = %v", err)
		}
		if _, failures, _ := e.recorded(t, "panics"); failures != 1 {
			t.Fatalf("failures = %d", failures)
		}
		// The lock was released: the job can run again.
		if err := s.RunNow(ctx, "panics"); err == nil || jobs.IsSkipped(err) {
			t.Fatalf("second run: err = %v, want the panic again, not a skip", err)
		}
	})
	t.Run("a job another replica is running is skipped", func(t *testing.T) {
		other := e.scheduler(t, nil)
		release := make(chan struct{})
		started := make(chan struct{})
		slow := func(context.Context) error { close(started); <-release; return nil }
		if err := s.Add("slow", "", slow); err != nil {
			t.Fatal(err)
		}
		if err := other.Add("slow", "", func(context.Context) error { t.Error("ran twice at once"); return nil }); err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() { done <- s.RunNow(ctx, "slow") }()
		<-started
		if err := other.RunNow(ctx, "slow"); !jobs.IsSkipped(err) {
			t.Fatalf("err = %v, want skipped", err)
		}
		if st := find(t, other.Status(), "slow"); st.LastOutcome != "skipped: another replica" || !find(t, s.Status(), "slow").Running {
			t.Fatalf("other's status = %+v", st)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// TestJobsSingleRunner runs the same @every 1s job on two schedulers over
// one schema: every tick must run on exactly one of them, never both at
// once.
func TestJobsSingleRunner(t *testing.T) {
	t.Parallel()
	e := setup(t)
	type run struct {
		replica string
		start   time.Time
	}
	var (
		mu      sync.Mutex
		runs    []run
		active  atomic.Int32
		overlap atomic.Int32
	)
	job := func(replica string) func(context.Context) error {
		return func(ctx context.Context) error {
			if active.Add(1) > 1 {
				overlap.Add(1)
			}
			defer active.Add(-1)
			mu.Lock()
			runs = append(runs, run{replica, time.Now()})
			mu.Unlock()
			// Long enough that the other replica's tick of the same second
			// finds the lock held, short enough to end before the next.
			select {
			case <-time.After(600 * time.Millisecond):
			case <-ctx.Done():
			}
			return nil
		}
	}
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a, b := e.scheduler(t, regA), e.scheduler(t, regB)
	if err := a.Add("tick", "@every 1s", job("a")); err != nil {
		t.Fatal(err)
	}
	if err := b.Add("tick", "@every 1s", job("b")); err != nil {
		t.Fatal(err)
	}
	a.Start()
	b.Start()
	time.Sleep(4500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	if overlap.Load() != 0 {
		t.Fatalf("the job ran on both replicas at once %d times", overlap.Load())
	}
	perTick := map[int64][]string{}
	for _, r := range runs {
		sec := r.start.Round(time.Second).Unix()
		perTick[sec] = append(perTick[sec], r.replica)
	}
	if len(perTick) < 3 {
		t.Fatalf("only %d ticks ran in 4.5s: %v", len(perTick), perTick)
	}
	for sec, who := range perTick {
		if len(who) != 1 {
			t.Errorf("tick %d ran on %v, want exactly one replica", sec, who)
		}
	}
	recorded, failures, _ := e.recorded(t, "tick")
	if recorded != int64(len(runs)) || failures != 0 {
		t.Fatalf("job_runs says %d runs (%d failures), the job ran %d times", recorded, failures, len(runs))
	}
	ran := counter(t, regA, "outboxd_job_runs_total", "tick") + counter(t, regB, "outboxd_job_runs_total", "tick")
	skipped := counter(t, regA, "outboxd_job_skips_total", "tick") + counter(t, regB, "outboxd_job_skips_total", "tick")
	if int(ran) != len(runs) || int(skipped) != len(perTick) {
		t.Fatalf("metrics: %v runs, %v skips; want %d runs and one skip per tick (%d)", ran, skipped, len(runs), len(perTick))
	}
	t.Logf("%d ticks, each run on one replica (%d runs, %v skips by the other)", len(perTick), len(runs), skipped)
}

func find(t *testing.T, sts []jobs.Status, name string) jobs.Status {
	t.Helper()
	for _, st := range sts {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("no status for job %q in %+v", name, sts)
	return jobs.Status{}
}

// counter reads one job's series of a counter family; 0 when absent.
func counter(t *testing.T, g prometheus.Gatherer, name, job string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "job_name" && l.GetValue() == job {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestJobsTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := jobs.New(jobs.Config{Pool: e.pool, Schema: e.schema, Timeout: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() { _ = s.Stop(context.Background()) })

	t.Run("a run past its deadline is cancelled and recorded as timed out", func(t *testing.T) {
		if err := s.Add("hangs", "", func(ctx context.Context) error {
			_, err := e.pool.Exec(ctx, `SELECT pg_sleep(60)`)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := s.RunNow(context.Background(), "hangs")
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("the run took %v, want it cut at 300ms", took)
		}
		if !errors.Is(err, jobs.ErrTimedOut) {
			t.Fatalf("err = %v, want ErrTimedOut", err)
		}
		if _, failures, lastErr := e.recorded(t, "hangs"); failures != 1 || !strings.Contains(lastErr, "run timed out after 300ms") {
			t.Fatalf("job_runs: %d failures, last error %q", failures, lastErr)
		}
	})
}
