package admin_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
)

func TestAdminMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.jobs = jobs.New(jobs.Config{Pool: e.pool, Schema: e.schema, Registerer: e.reg, Logger: e.quiet})
	if err := e.jobs.Add("retention", "@every 1h", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	e.startRelay(t)
	e.startAdmin(t, admin.Config{})

	t.Run("events by outcome per index are on /metrics", func(t *testing.T) {
		e.append(t, docs("books", 0, 20, 1, "")...)
		e.append(t, docs("books", 0, 5, 1, "")...) // duplicates: stale
		e.append(t, docs("films", 0, 7, 1, "")...)
		e.append(t, docs("films", 100, 2, 1, `,"bad":true`)...)
		schematest.Eventually(t, 15*time.Second, "the relay handled every event", func() bool {
			m := e.scrape(t)
			return m.sum("outboxd_events_total", "index", "books", "outcome", "applied") == 20 &&
				m.sum("outboxd_events_total", "index", "books", "outcome", "stale") == 5 &&
				m.sum("outboxd_events_total", "index", "films", "outcome", "applied") == 7 &&
				m.sum("outboxd_events_total", "index", "films", "outcome", "rejected") == 2
		})
	})
	t.Run("the backlog, its age and parked dead letters are computed at scrape time", func(t *testing.T) {
		schematest.Eventually(t, 10*time.Second, "the backlog is empty", func() bool {
			m := e.scrape(t)
			return m.has("outboxd_backlog_events") && m.sum("outboxd_backlog_events") == 0 && m.sum("outboxd_dead_letters_parked", "index", "films") == 2
		})
		m := e.scrape(t)
		if m.sum("outboxd_oldest_unacked_age_seconds", "stream", "default") != 0 || m.sum("outboxd_stats_up") != 1 {
			t.Fatalf("empty backlog: oldest age %v, stats_up %v", m.sum("outboxd_oldest_unacked_age_seconds"), m.sum("outboxd_stats_up"))
		}

		e.sink.hold()
		e.append(t, docs("books", 500, 12, 1, "")...)
		time.Sleep(1100 * time.Millisecond) // the stats cache's TTL, and some age
		schematest.Eventually(t, 10*time.Second, "the held events show as backlog", func() bool {
			return e.scrape(t).sum("outboxd_backlog_events", "stream", "default") == 12
		})
		// The stats are cached for a second: a scrape may serve a value
		// computed just under a second after the commit.
		schematest.Eventually(t, 10*time.Second, "the oldest held event is at least 1s old", func() bool {
			return e.scrape(t).sum("outboxd_oldest_unacked_age_seconds", "stream", "default") >= 1
		})
		e.sink.release()
		schematest.Eventually(t, 10*time.Second, "the backlog drains", func() bool { return e.scrape(t).sum("outboxd_backlog_events") == 0 })
	})
	t.Run("the relay's leader gauge and the job metrics are served", func(t *testing.T) {
		if err := e.jobs.RunNow(context.Background(), "retention"); err != nil {
			t.Fatal(err)
		}
		m := e.scrape(t)
		if m.sum("outboxd_leader", "stream", "default") != 1 {
			t.Fatalf("outboxd_leader{stream=default} = %v", m.sum("outboxd_leader", "stream", "default"))
		}
		if m.sum("outboxd_job_runs_total", "job_name", "retention") != 1 || !m.has("outboxd_job_duration_seconds_count") {
			t.Fatalf("job metrics missing: runs %v", m.sum("outboxd_job_runs_total", "job_name", "retention"))
		}
	})
	t.Run("the summary agrees with /metrics", func(t *testing.T) {
		code, body, _ := e.get(t, "/api/summary")
		if code != 200 {
			t.Fatalf("/api/summary: %d %s", code, body)
		}
		var s admin.Summary
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatal(err)
		}
		m := e.scrape(t)
		byIndex := map[string]admin.IndexView{}
		for _, v := range s.Indexes {
			byIndex[v.Index] = v
		}
		books, films := byIndex["books"], byIndex["films"]
		if books.Applied != m.sum("outboxd_events_total", "index", "books", "outcome", "applied") || books.Applied != 32 ||
			books.Stale != 5 || films.Rejected != 2 || films.Parked != 2 || !strings.Contains(films.LastReason, "mapper_parsing_exception") {
			t.Fatalf("indexes = %+v", s.Indexes)
		}
		if s.Totals.Backlog != 0 || s.Totals.Parked != 2 || len(s.Streams) != 1 || s.Streams[0].Role != "leader" || s.Streams[0].LeaderPID == 0 {
			t.Fatalf("totals %+v, streams %+v", s.Totals, s.Streams)
		}
		if len(s.Jobs) != 1 || s.Jobs[0].Name != "retention" || s.Jobs[0].Runs != 1 {
			t.Fatalf("jobs = %+v", s.Jobs)
		}
		if len(s.History) < 2 {
			t.Fatalf("history has %d samples", len(s.History))
		}
		last := s.History[len(s.History)-1]
		if _, body2, _ := e.get(t, "/api/summary?since="+itoa(last.T)); strings.Contains(body2, `"t": `+itoa(last.T)+",") {
			t.Fatal("since= returned the sample it was given")
		}
	})
}

func TestAdminReadyz(t *testing.T) {
	t.Parallel()

	t.Run("ready with both servers reachable, reporting the role", func(t *testing.T) {
		e := setup(t)
		e.startRelay(t)
		e.startAdmin(t, admin.Config{})
		code, body, _ := e.get(t, "/readyz")
		if code != 200 || !strings.Contains(body, `"elasticsearch": "ok"`) || !strings.Contains(body, `"postgres": "ok"`) || !strings.Contains(body, `"default": "leader"`) {
			t.Fatalf("/readyz: %d %s", code, body)
		}
	})
	t.Run("503 naming the failing check", func(t *testing.T) {
		e := setup(t)
		e.startAdmin(t, admin.Config{Ready: map[string]func(context.Context) error{
			"postgres":      e.pool.Ping,
			"elasticsearch": func(context.Context) error { return errors.New("dial tcp 127.0.0.1:1: connection refused") },
		}})
		code, body, h := e.get(t, "/readyz")
		if code != 503 || h.Get("X-Outboxd-Failing") != "elasticsearch" || !strings.Contains(body, `"failing": [`) || !strings.Contains(body, "connection refused") {
			t.Fatalf("/readyz: %d %s", code, body)
		}
	})
	t.Run("healthz answers whatever the checks say", func(t *testing.T) {
		e := setup(t)
		e.startAdmin(t, admin.Config{Ready: map[string]func(context.Context) error{"x": func(context.Context) error { return errors.New("down") }}})
		if code, body, _ := e.get(t, "/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
			t.Fatalf("/healthz: %d %s", code, body)
		}
	})
}

func TestAdminToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startAdmin(t, admin.Config{Token: "s3cret-token", Ready: map[string]func(context.Context) error{"postgres": e.pool.Ping}})

	for _, path := range []string{"/metrics", "/readyz", "/api/summary", "/"} {
		t.Run(path+" needs the token", func(t *testing.T) {
			if code, _, h := e.get(t, path); code != 401 || h.Get("WWW-Authenticate") == "" {
				t.Fatalf("no token: %d", code)
			}
			if code, _, _ := e.get(t, path, "Authorization", "Bearer wrong"); code != 401 {
				t.Fatalf("wrong token: %d", code)
			}
			if code, _, _ := e.get(t, path, "Authorization", "Bearer s3cret-token"); code != 200 {
				t.Fatalf("bearer token: %d", code)
			}
			basic := base64.StdEncoding.EncodeToString([]byte("ops:s3cret-token"))
			if code, _, _ := e.get(t, path, "Authorization", "Basic "+basic); code != 200 {
				t.Fatalf("basic with the token as password: %d", code)
			}
		})
	}
	t.Run("/healthz is open", func(t *testing.T) {
		if code, _, _ := e.get(t, "/healthz"); code != 200 {
			t.Fatalf("/healthz: %d", code)
		}
	})
}

func TestAdminConfig(t *testing.T) {
	t.Parallel()
	t.Run("Gatherer and Stats are required", func(t *testing.T) {
		if _, err := admin.New(admin.Config{Addr: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "Gatherer") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("an address in use fails at New, naming the flag", func(t *testing.T) {
		e := setup(t)
		e.startAdmin(t, admin.Config{})
		_, err := admin.New(admin.Config{Addr: e.srv.Addr(), Gatherer: e.reg, Stats: func(context.Context) (*relay.Stats, error) { return &relay.Stats{}, nil }})
		if err == nil || !strings.Contains(err.Error(), "--admin-addr") {
			t.Fatalf("err = %v", err)
		}
	})
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestAdminRedactsErrorTexts(t *testing.T) {
	t.Parallel()
	leak := errors.New(`dial "postgres://alice:pw-secret@10.0.0.1/db": refused`)
	srv, err := admin.New(admin.Config{
		Addr: "127.0.0.1:0", Gatherer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		Stats:  func(context.Context) (*relay.Stats, error) { return nil, leak },
		Ready:  map[string]func(context.Context) error{"postgres": func(context.Context) error { return leak }},
		Redact: strings.NewReplacer("pw-secret", "xxxxx").Replace,
	})
	if err != nil {
		t.Fatal(err)
	}
	goRun(t, "admin server", srv.Run)
	for _, path := range []string{"/readyz", "/api/summary"} {
		t.Run(path+" shows the error without its password", func(t *testing.T) {
			resp, err := http.Get("http://" + srv.Addr() + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if strings.Contains(string(body), "pw-secret") || !strings.Contains(string(body), "alice:xxxxx@10.0.0.1") {
				t.Fatalf("%s: %s", path, body)
			}
		})
	}
}
