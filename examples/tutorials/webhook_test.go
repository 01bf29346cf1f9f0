package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
	"github.com/outboxd/outboxd/schema/schematest"
	"github.com/outboxd/outboxd/webhook"
)

var hookSecret = []byte("tutorials-webhook-secret")

// signed builds a request as outboxd's webhook sink sends it.
func (e *testEnv) signed(t *testing.T, key, body string, secret []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest("POST", e.ts.URL+"/api/webhooks/billing", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Now().Unix()
	req.Header.Set(webhook.HeaderIdempotencyKey, key)
	req.Header.Set(webhook.HeaderID, key)
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(secret, key, ts, []byte(body)))
	return req
}

func post(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestWebhookReceiver(t *testing.T) {
	t.Parallel()
	withSecret := func(c *Config) { c.WebhookSecret = hookSecret }

	t.Run("a message from the outboxd relay is applied once, however often it arrives", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withSecret)
		ctx := context.Background()
		sink, err := webhook.NewSink(webhook.Options{Pool: e.pool, Schema: e.outbox, Destination: webhook.Destination{
			Name: "billing", URL: e.ts.URL + "/api/webhooks/billing", Secret: hookSecret, Idempotent: true}})
		if err != nil {
			t.Fatal(err)
		}
		r, err := relay.New(relay.Config{Pool: e.pool, Schema: e.outbox, Registerer: prometheus.NewRegistry(),
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
			Streams: []relay.Stream{{Name: "webhook-billing", BucketHi: 1023, Indexes: []string{outbox.MessageIndex("billing")}, Sink: sink}}})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go r.Run(runCtx)
		ob, _ := outbox.NewOutbox(e.outbox)
		if _, err := ob.AppendMessage(ctx, e.pool, outbox.Message{Destination: "billing", DedupeKey: "invoice-1", Payload: json.RawMessage(`{"amount":10}`)}); err != nil {
			t.Fatal(err)
		}
		schematest.Eventually(t, 20*time.Second, "the notification is received", func() bool {
			return e.count(t, `SELECT count(*) FROM `+e.srv.notifications+` WHERE key = 'invoice-1'`) == 1
		})
		// The sender retries (its answer was lost): a repeat, no second effect.
		code, body := post(t, e.signed(t, "invoice-1", `{"amount": 10}`, hookSecret))
		if code != 200 || !bytes.Contains([]byte(body), []byte("duplicate")) {
			t.Fatalf("repeat: %d %s", code, body)
		}
		if n := e.count(t, `SELECT count(*) FROM `+e.srv.notifications); n != 1 {
			t.Fatalf("%d notifications", n)
		}
	})

	t.Run("concurrent deliveries of one key have one effect", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withSecret)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if code, body := post(t, e.signed(t, "k", `{"n":1}`, hookSecret)); code != 200 {
					t.Errorf("%d %s", code, body)
				}
			}()
		}
		wg.Wait()
		if n := e.count(t, `SELECT count(*) FROM `+e.srv.notifications); n != 1 {
			t.Fatalf("%d notifications", n)
		}
	})

	t.Run("a tampered body or another secret is refused with 401 and no effect", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withSecret)
		req := e.signed(t, "k", `{"amount":10}`, hookSecret)
		req.Body = io.NopCloser(bytes.NewReader([]byte(`{"amount":99}`)))
		req.ContentLength = int64(len(`{"amount":99}`))
		if code, _ := post(t, req); code != 401 {
			t.Fatalf("tampered body: %d", code)
		}
		if code, _ := post(t, e.signed(t, "k", `{"amount":10}`, []byte("wrong"))); code != 401 {
			t.Fatalf("another secret: %d", code)
		}
		if n := e.count(t, `SELECT count(*) FROM `+e.srv.notifications); n != 0 {
			t.Fatalf("%d notifications", n)
		}
	})

	t.Run("a captured request replayed with another Idempotency-Key or path has one effect", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withSecret)
		body := `{"amount":10}`
		captured := e.signed(t, "invoice-7", body, hookSecret)
		replay := func(path, idempotencyKey string) {
			req, err := http.NewRequest("POST", e.ts.URL+path, bytes.NewReader([]byte(body)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header = captured.Header.Clone()
			if idempotencyKey != "" {
				req.Header.Set(webhook.HeaderIdempotencyKey, idempotencyKey)
			}
			if code, got := post(t, req); code != 200 {
				t.Fatalf("%s with Idempotency-Key %q: %d %s", path, idempotencyKey, code, got)
			}
		}
		replay("/api/webhooks/billing", "")
		replay("/api/webhooks/billing", "forged-1")
		replay("/api/webhooks/shipping", "")
		replay("/api/webhooks/shipping", "forged-2")
		if n := e.count(t, `SELECT count(*) FROM `+e.srv.notifications); n != 1 {
			t.Fatalf("%d effects from one signed message, want 1", n)
		}
		if n := e.count(t, `SELECT count(*) FROM `+e.srv.notifications+` WHERE source = 'outboxd' AND key = 'invoice-7'`); n != 1 {
			t.Fatalf("the effect is not recorded under the signing source and the webhook-id")
		}
	})

	t.Run("while the sender rotates its secret, the previous one is accepted too", func(t *testing.T) {
		t.Parallel()
		previous := []byte("tutorials-webhook-previous")
		e := setup(t, func(c *Config) { c.WebhookSecret, c.WebhookPreviousSecret = hookSecret, previous })
		if code, got := post(t, e.signed(t, "k1", `{"n":1}`, previous)); code != 200 {
			t.Fatalf("previous secret: %d %s", code, got)
		}
		if code, got := post(t, e.signed(t, "k2", `{"n":2}`, hookSecret)); code != 200 {
			t.Fatalf("current secret: %d %s", code, got)
		}
		if code, _ := post(t, e.signed(t, "k3", `{"n":3}`, []byte("neither"))); code != 401 {
			t.Fatalf("another secret: %d", code)
		}
	})

	t.Run("without a secret the endpoint is off", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		if code, _ := post(t, e.signed(t, "k", `{}`, hookSecret)); code != 404 {
			t.Fatalf("got %d", code)
		}
	})
}
