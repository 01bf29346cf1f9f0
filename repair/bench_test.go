package repair

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/tooltest"
)

// BenchmarkRepair200k plans and applies a repair of a 200k-document index
// (OUTBOXD_BENCH_DOCS overrides the size) where ~10% of the documents are
// legacy duplicates at random _ids, half of them newer than the canonical
// copy (so the keeper is rewritten) and half older (only removed). It
// reports the peak RSS of plan + apply (VmHWM, reset before the plan) and
// the time of each step. Run:
//
//	go test ./repair/ -run '^$' -bench Repair200k -benchtime 1x
func BenchmarkRepair200k(b *testing.B) {
	total := 200_000
	if s := os.Getenv("OUTBOXD_BENCH_DOCS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 10 {
			b.Fatalf("OUTBOXD_BENCH_DOCS: %q is not a number >= 10", s)
		}
		total = n
	}
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ri := tooltest.NewFamily(b, false)
		ri.Raw(b, "PUT", "/"+ri.Write+"/_settings", `{"index":{"refresh_interval":"-1"}}`)
		dups := benchSeed(b, ri, total)
		ri.Raw(b, "PUT", "/"+ri.Write+"/_settings", `{"index":{"refresh_interval":null}}`)
		ri.Refresh(b)
		runtime.GC()
		resetPeakRSS(b)
		b.StartTimer()

		t0 := time.Now()
		plan, err := PlanDuplicates(ctx, ri.ES, Options{Index: ri.Name, PageSize: 2000})
		if err != nil {
			b.Fatal(err)
		}
		planDur := time.Since(t0)
		s := plan.Summary()
		if s.Scanned != int64(total) || s.Groups != dups {
			b.Fatalf("summary %+v, want %d scanned and %d groups", s, total, dups)
		}
		t1 := time.Now()
		res, err := plan.Apply(ctx, ri.ES, ApplyOptions{BackupPath: filepath.Join(b.TempDir(), "backup.ndjson")})
		if err != nil {
			b.Fatal(err)
		}
		applyDur := time.Since(t1)
		b.StopTimer()
		if len(res.Skipped) != 0 || res.Removed != s.Remove {
			b.Fatalf("result: removed %d of %d, skipped %d", res.Removed, s.Remove, len(res.Skipped))
		}
		b.ReportMetric(float64(peakRSS(b))/(1<<20), "peakRSS_MB")
		b.ReportMetric(planDur.Seconds(), "plan_s")
		b.ReportMetric(applyDur.Seconds(), "apply_s")
		b.ReportMetric(float64(total)/(planDur+applyDur).Seconds(), "docs/s")
		b.Logf("%d docs, %d groups: plan %s, apply %s (rewritten %d, removed %d)", total, s.Groups, planDur.Round(time.Millisecond), applyDur.Round(time.Millisecond), res.Rewritten, res.Removed)
		b.StartTimer()
	}
}

// benchSeed bulk-loads total documents: total*0.9 canonical ones and
// the rest as duplicates of the first keys. It returns the number of keys
// with a duplicate.
func benchSeed(b *testing.B, ri *tooltest.Family, total int) int {
	b.Helper()
	ctx := context.Background()
	dups := total / 10
	unique := total - dups
	filler := strings.Repeat("lorem ipsum ", 12)
	var buf bytes.Buffer
	send := func() {
		if buf.Len() == 0 {
			return
		}
		items, err := bulk(ctx, ri.ES, buf.Bytes())
		if err != nil {
			b.Fatal(err)
		}
		for _, it := range items {
			if it.Status >= 300 {
				b.Fatalf("seed: %s", it.Reason())
			}
		}
		buf.Reset()
	}
	for i := 0; i < total; i++ {
		if i < unique {
			fmt.Fprintf(&buf, `{"index":{"_index":%q,"_id":"src-%d","version":5,"version_type":"external_gte"}}`+"\n", ri.Write, i)
			fmt.Fprintf(&buf, `{"title":"doc %d","updated_at":"2024-01-01T00:00:00Z","body":%q}`+"\n", i, filler)
		} else {
			k := i - unique // duplicates of src-0 .. src-(dups-1)
			v := 4          // older: only removed
			if k%2 == 0 {
				v = 6 // newer: rewritten over the canonical copy
			}
			fmt.Fprintf(&buf, `{"index":{"_index":%q,"_id":"legacy-%d"}}`+"\n", ri.Write, k)
			fmt.Fprintf(&buf, `{"source_id":"src-%d","version":%d,"title":"legacy %d","body":%q}`+"\n", k, v, k, filler)
		}
		if (i+1)%5000 == 0 {
			send()
		}
	}
	send()
	return dups
}

// resetPeakRSS resets VmHWM (Linux: writing 5 to clear_refs).
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset peak RSS (%v); it includes seeding", err)
	}
}

// peakRSS reads VmHWM in bytes.
func peakRSS(b *testing.B) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Logf("no /proc/self/status: %v", err)
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
