package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/webhook"
)

// lockedBuffer is a log destination shared by the sinks' goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A webhook URL's path and query are credentials (Slack, Discord, Teams):
// neither may appear in a log line, a ledger row, a listing or /metrics,
// whatever way the delivery ends.
func TestSecretURLNeverShown(t *testing.T) {
	t.Parallel()
	const pathSecret, querySecret = "B0SECRETPATH7x9", "QUERYSECRET4242"
	secretPath := "/services/T000/" + pathSecret + "?token=" + querySecret
	ctx := context.Background()
	e := setup(t)

	// "refused": a 404 page that echoes the request line, as many servers do.
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Cannot POST "+r.URL.RequestURI(), http.StatusNotFound)
	}))
	defer echo.Close()
	// "dead": nothing listens, so every attempt is a url.Error quoting the URL.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := l.Addr().String()
	l.Close()
	// "hang": the request is sent and no answer comes in time.
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer func() { close(release); hang.Close() }()

	refused := destination("refused", echo.URL+secretPath, false)
	dead := destination("dead", "http://"+deadAddr+secretPath, false)
	dead.MaxAttempts = 2
	hung := destination("hang", hang.URL+secretPath, false)
	hung.MaxAttempts = 2

	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	reg := prometheus.NewRegistry()
	m := webhook.NewMetrics(reg)
	reg.MustRegister(webhook.NewLedgerCollector(e.pool, `"`+e.schema+`"`))
	var ss []relay.Stream
	for _, d := range []webhook.Destination{refused, dead, hung} {
		log.Info("webhook destination", "destination", d.String())
		s, err := webhook.NewSink(webhook.Options{Pool: e.pool, Schema: e.schema, Destination: d, Metrics: m, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, relay.Stream{Name: "webhook-" + d.Name, BucketHi: 1023, Indexes: []string{outbox.MessageIndex(d.Name)}, Sink: s})
	}
	cfg := relayConfig(e.pool, e.schema, ss)
	cfg.Logger = log
	stop := start(t, cfg)
	for _, d := range []string{"refused", "dead", "hang"} {
		e.send(t, d, "k-"+d, `{"n":1}`)
	}
	e.waitState(t, "refused", "k-refused", webhook.StateFailed)
	e.waitUnsent(t, "dead", "k-dead")
	hung0 := e.delivery(t, "hang", "k-hang")
	for deadline := time.Now().Add(20 * time.Second); hung0.State == webhook.StateReserved || hung0.State == ""; hung0 = e.delivery(t, "hang", "k-hang") {
		if time.Now().After(deadline) {
			t.Fatal("the hung message never reached a final state")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()

	surfaces := map[string]string{"logs": logs.String()}
	var rows []string
	r, err := e.pool.Query(ctx, `SELECT row_to_json(d)::text FROM "`+e.schema+`".deliveries d`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var s string
		if err := r.Scan(&s); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, s)
	}
	if r.Err() != nil || len(rows) != 3 {
		t.Fatalf("%d ledger rows (%v)", len(rows), r.Err())
	}
	surfaces["ledger rows"] = strings.Join(rows, "\n")
	ds, err := webhook.List(ctx, e.pool, e.schema, webhook.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(ds)
	surfaces["deliveries list --json"] = string(js)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	surfaces["metrics"] = fmt.Sprint(mfs)
	_, err = webhook.ParseDestination("x=https://hooks.example.com/services/T000/"+pathSecret+"?token="+querySecret+",2"+querySecret+",secret_env=S", func(string) string { return "s" })
	surfaces["flag error"] = fmt.Sprint(err)
	_, err = webhook.ParseDestination("https://hooks.example.com/services/T000/"+pathSecret+"?token="+querySecret, nil)
	surfaces["flag error without NAME="] = fmt.Sprint(err)

	for name, text := range surfaces {
		for _, s := range []string{pathSecret, querySecret} {
			if strings.Contains(text, s) {
				t.Errorf("%s show the secret %q:\n%s", name, s, text)
			}
		}
	}
	// What the operator still sees: which destination, and why.
	for _, want := range []string{"refused=http://127.0.0.1:", "/…", "HTTP 404"} {
		if !strings.Contains(surfaces["logs"]+surfaces["ledger rows"], want) {
			t.Errorf("the logs and ledger lost %q:\n%s\n%s", want, surfaces["logs"], surfaces["ledger rows"])
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://hooks.slack.com/services/T000/B000/XXXX": "https://hooks.slack.com/…",
		"https://user:pw@example.com:8443/hook?token=abc": "https://example.com:8443/…",
		"http://127.0.0.1:9000":                           "http://127.0.0.1:9000",
		"http://127.0.0.1:9000/":                          "http://127.0.0.1:9000",
		"not a url":                                       "(invalid URL)",
	} {
		if got := webhook.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
