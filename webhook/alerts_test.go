package webhook_test

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/webhook"
)

// TestWebhookAlertRules: the webhook alerts in docs/prometheus-alerts.yml
// are there, well formed, and name only metrics this package exports (a
// renamed metric would leave an alert that never fires).
func TestWebhookAlertRules(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/prometheus-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("docs/prometheus-alerts.yml: %v", err)
	}
	exported := exportedMetrics(t)
	metric := regexp.MustCompile(`outboxd_[a-z_]+`)
	webhookMetric := regexp.MustCompile(`^outboxd_(webhook|messages)_`)
	var found []string
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			names := metric.FindAllString(r.Expr, -1)
			if !slices.ContainsFunc(names, func(n string) bool { return webhookMetric.MatchString(n) }) {
				continue // not a webhook alert
			}
			found = append(found, r.Alert)
			for _, n := range names {
				if !exported[n] {
					t.Errorf("%s: expr %q names %s, which the webhook package does not export", r.Alert, r.Expr, n)
				}
			}
			if r.For == "" || (r.Labels["severity"] != "page" && r.Labels["severity"] != "ticket") ||
				r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a for, severity page or ticket, a summary and a description: %+v", r.Alert, r)
			}
		}
	}
	for _, want := range []string{"OutboxdWebhookUnknownOutcomes", "OutboxdWebhookStuck", "OutboxdWebhookWaiting", "OutboxdWebhookCircuitOpen"} {
		if !slices.Contains(found, want) {
			t.Errorf("docs/prometheus-alerts.yml has no alert %s on the webhook metrics (has %v)", want, found)
		}
	}
}

// exportedMetrics are the names webhook.NewMetrics registers and the
// ledger collector describes: read from their descriptions, since a
// vector has no series to gather before it is first set.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	var rec recorder
	webhook.NewMetrics(&rec)
	rec.MustRegister(webhook.NewLedgerCollector(nil, `"x"`))
	descs := make(chan *prometheus.Desc, 64)
	for _, c := range rec {
		c.Describe(descs)
	}
	close(descs)
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	if len(names) < 5 {
		t.Fatalf("only %v read from the webhook collectors", names)
	}
	return names
}

// recorder is a Registerer that keeps what is registered.
type recorder []prometheus.Collector

func (r *recorder) Register(c prometheus.Collector) error   { *r = append(*r, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { *r = append(*r, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }
