package admin_test

import (
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/jobs"
	"github.com/outboxd/outboxd/rebuild"
	"github.com/outboxd/outboxd/schema/schematest"
)

// chromium finds the browser scripts/install-chromium installs. A missing
// browser fails the test: the page is only proven in a real one.
func chromium(t *testing.T) string {
	t.Helper()
	if schematest.UnitOnly() {
		t.Skip("needs Chromium; unit tests only")
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("Chromium is not installed: run scripts/install-chromium (Debian packages chromium and chromium-driver)")
	return ""
}

// headless runs Chromium once over url with the extra flags and returns
// its standard output.
func headless(t *testing.T, bin, url string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000"}, extra...)
	args = append(args, url)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", extra, err, stderr.String())
	}
	return string(out)
}

// repoRoot is where artifacts/ lives.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// shown reads the number an element displays ("1,234" -> 1234).
func shown(t *testing.T, dom, pattern string) float64 {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the page has no match for %s", pattern)
	}
	v, err := strconv.ParseFloat(strings.ReplaceAll(html.UnescapeString(m[1]), ",", ""), 64)
	if err != nil {
		t.Fatalf("%s shows %q: %v", pattern, m[1], err)
	}
	return v
}

// cell is the number the per-index table shows for index and metric.
func cell(t *testing.T, dom, index, metric string) float64 {
	t.Helper()
	table := regexp.MustCompile(`(?s)<table id="index-table">.*?</table>`).FindString(dom)
	row := regexp.MustCompile(`(?s)<tr data-index="` + regexp.QuoteMeta(index) + `">.*?</tr>`).FindString(table)
	if row == "" {
		t.Fatalf("the index table has no row for %q", index)
	}
	return shown(t, row, `data-metric="`+metric+`"[^>]*>([^<]*)</td>`)
}

// TestDashboardInBrowser loads the page in headless Chromium against a
// running relay that has handled traffic, and checks that what the page
// shows is what /metrics says.
func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	e := setup(t)
	e.jobs = jobs.New(jobs.Config{Pool: e.pool, Schema: e.schema, Registerer: e.reg, Logger: e.quiet})
	if err := e.jobs.Add("outbox-retention", "@every 1h", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := e.jobs.Add("tombstone-purge", "0 3 * * *", func(context.Context) error { return fmt.Errorf("index tutorials-read: no such alias") }); err != nil {
		t.Fatal(err)
	}
	e.sink.delay = 40 * time.Millisecond
	e.startRelay(t)
	ctx := context.Background()
	// A rebuild in progress, as outboxd rebuild stores it.
	if _, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".rebuilds (index_name, old_index, new_index, phase, options_hash, checkpoints, copied, total)
VALUES ('tutorials', 'tutorials-000001', 'tutorials-000002', 'catching_up', 'x', '{}', 1234, 2000)`); err != nil {
		t.Fatal(err)
	}
	e.startAdmin(t, admin.Config{SampleInterval: 300 * time.Millisecond, Rebuilds: func(ctx context.Context) ([]rebuild.Status, error) {
		return rebuild.Unfinished(ctx, e.pool, e.schema)
	}})
	_ = e.jobs.RunNow(ctx, "outbox-retention")
	_ = e.jobs.RunNow(ctx, "tombstone-purge")

	// Traffic in bursts, with duplicates (stale) and rejected documents,
	// so the charts have a shape.
	for burst := range 6 {
		e.append(t, docs("tutorials", burst*150, 150, 1, "")...)
		e.append(t, docs("authors", burst*40, 40, 1, "")...)
		e.append(t, docs("tutorials", burst*150, 30, 1, "")...) // redelivered
		if burst%2 == 1 {
			e.append(t, docs("authors", 9000+burst, 1, 1, `,"bad":true`)...)
		}
		time.Sleep(600 * time.Millisecond)
	}
	schematest.Eventually(t, 60*time.Second, "the traffic drained", func() bool { return e.backlog(t) == 0 })
	time.Sleep(time.Second) // a few samples at zero

	// Stop deliveries and leave a known backlog, so every figure is stable
	// while the browser reads it.
	e.sink.hold()
	e.append(t, docs("tutorials", 50000, 25, 1, "")...)
	schematest.Eventually(t, 10*time.Second, "the held backlog shows", func() bool { return e.backlog(t) == 25 })
	// The server reuses a backlog count for 50 times the time it took (a
	// slow count is not run again soon): under load, the count taken
	// before the append was still served seconds later, and a fixed sleep
	// read a backlog of 0. Wait until /metrics has the held backlog and
	// its oldest event is over a second old.
	schematest.Eventually(t, 70*time.Second, "/metrics shows the held backlog, over a second old", func() bool {
		m := e.scrape(t)
		return m.sum("outboxd_backlog_events") == 25 && m.sum("outboxd_oldest_unacked_age_seconds") >= 1
	})

	dom := headless(t, bin, e.base+"/", "--dump-dom")
	m := e.scrape(t)
	if !strings.Contains(dom, `data-loaded="1"`) {
		t.Fatalf("the page's script did not render a summary; DOM:\n%s", dom)
	}

	t.Run("the backlog shown is the backlog on /metrics", func(t *testing.T) {
		got := shown(t, dom, `id="backlog-total"[^>]*>([^<]*)<`)
		if want := m.sum("outboxd_backlog_events"); got != want || got != 25 {
			t.Fatalf("page shows backlog %v, /metrics has %v (want 25)", got, want)
		}
	})
	t.Run("applied, stale and rejected per index match /metrics", func(t *testing.T) {
		for _, idx := range []string{"tutorials", "authors"} {
			for _, outcome := range []string{"applied", "stale", "rejected"} {
				got := cell(t, dom, idx, outcome)
				if want := m.sum("outboxd_events_total", "index", idx, "outcome", outcome); got != want {
					t.Errorf("%s %s: page shows %v, /metrics has %v", idx, outcome, got, want)
				}
			}
		}
		if got := cell(t, dom, "tutorials", "applied"); got != 900 {
			t.Errorf("tutorials applied = %v, want 900", got)
		}
		if got := cell(t, dom, "tutorials", "stale"); got != 180 {
			t.Errorf("tutorials stale = %v, want 180", got)
		}
	})
	t.Run("parked dead letters match /metrics and show their reason", func(t *testing.T) {
		got := shown(t, dom, `id="parked-total"[^>]*>([^<]*)<`)
		if want := m.sum("outboxd_dead_letters_parked"); got != want || got != 3 {
			t.Fatalf("page shows %v parked, /metrics has %v (want 3)", got, want)
		}
		if !strings.Contains(dom, "mapper_parsing_exception") {
			t.Fatal("the dead letters' reason is not on the page")
		}
	})
	t.Run("leadership and jobs are shown", func(t *testing.T) {
		if !regexp.MustCompile(`<tr data-stream="default">.*?<span class="tag leader">leader</span>`).MatchString(dom) {
			t.Fatal("the stream is not shown as led by this process")
		}
		if !regexp.MustCompile(`<tr data-job="tombstone-purge">.*?no such alias`).MatchString(dom) {
			t.Fatal("the failing job and its error are not shown")
		}
	})
	t.Run("a rebuild in progress is shown with its phase and count", func(t *testing.T) {
		if !regexp.MustCompile(`(?s)id="rebuild-table".*?tutorials-000001 → tutorials-000002</td><td>catching_up</td><td class="num" data-metric="copied" data-value="1234"`).MatchString(dom) {
			t.Fatal("the rebuild is not on the page")
		}
	})
	t.Run("the oldest unacknowledged age is shown", func(t *testing.T) {
		age := shown(t, dom, `id="oldest-age"[^>]*data-value="([^"]*)"`)
		if age <= 0 || age > m.sum("outboxd_oldest_unacked_age_seconds")+1 {
			t.Fatalf("page shows age %v, /metrics %v", age, m.sum("outboxd_oldest_unacked_age_seconds"))
		}
	})
	t.Run("a screenshot is saved as the test artifact", func(t *testing.T) {
		dir := filepath.Join(repoRoot(t), "artifacts")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		png := filepath.Join(dir, "dashboard.png")
		_ = os.Remove(png)
		headless(t, bin, e.base+"/", "--screenshot="+png, "--window-size=1400,1000", "--hide-scrollbars")
		if fi, err := os.Stat(png); err != nil || fi.Size() < 10000 {
			t.Fatalf("screenshot %s: %v (%v bytes)", png, err, fi)
		}
		// The whole page too, for a look at the tables below the fold.
		full := filepath.Join(dir, "dashboard-full.png")
		headless(t, bin, e.base+"/", "--screenshot="+full, "--window-size=1400,1900", "--hide-scrollbars")
		t.Logf("screenshots: %s, %s", png, full)
	})
}
