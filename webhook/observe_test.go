package webhook_test

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// series is the value of the one series of name whose labels include
// every pair of labels (name, value, ...), counter or gauge; ok is false
// when the registry has no such series.
func series(t *testing.T, g prometheus.Gatherer, name string, labels ...string) (v float64, ok bool) {
	t.Helper()
	v, ok, err := gather(g, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v, ok
}

// gather is series for a goroutine other than the test's.
func gather(g prometheus.Gatherer, name string, labels ...string) (v float64, ok bool, err error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true, nil
			}
			return m.GetGauge().GetValue(), true, nil
		}
	}
	return 0, false, nil
}

// records are the JSON log records in text (one slog.JSONHandler record
// a line) whose message contains sub.
func records(t *testing.T, text, sub string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if msg, _ := r["msg"].(string); strings.Contains(msg, sub) {
			out = append(out, r)
		}
	}
	return out
}
