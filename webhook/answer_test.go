package webhook_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/webhook"
)

// effectReceiver applies every request it reads (it does not dedupe) and
// then misbehaves with answer.
type effectReceiver struct {
	*httptest.Server
	mu      sync.Mutex
	effects map[string]int
}

func newEffectReceiver(t *testing.T, answer func(w http.ResponseWriter)) *effectReceiver {
	t.Helper()
	r := &effectReceiver{effects: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.ReadAll(req.Body)
		r.mu.Lock()
		r.effects[req.Header.Get("webhook-id")]++
		r.mu.Unlock()
		answer(w)
	}))
	t.Cleanup(func() { r.CloseClientConnections(); r.Close() })
	return r
}

func (r *effectReceiver) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.effects[key]
}

// TestAnswerAfterEffect: a receiver that does not dedupe applies the
// message and then answers an error, hangs or resets: the message is
// never sent again and ends unknown.
func TestAnswerAfterEffect(t *testing.T) {
	t.Parallel()
	answers := map[string]func(w http.ResponseWriter){
		"500":   status(500),
		"502":   status(502),
		"504":   status(504),
		"hang":  hang(time.Second),
		"reset": func(w http.ResponseWriter) { cut(w, "") },
	}
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			rcv := newEffectReceiver(t, answer)
			e.run(t, destination("hook", rcv.URL, false))
			e.send(t, "hook", "k", `{"n":1}`)
			d := e.waitState(t, "hook", "k", webhook.StateUnknown)
			if n := rcv.count("k"); n != 1 || d.Attempts != 1 {
				t.Fatalf("%d effects, %d attempts, want 1 and 1 (%s)", n, d.Attempts, d.LastError)
			}
		})
	}
	t.Run("a 5xx is retried when the destination says retry_5xx=true", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		rcv := newScripted(t, status(502), status(200))
		d := destination("hook", rcv.URL, false)
		d.Retry5xx = true
		e.run(t, d)
		e.send(t, "hook", "k", `{}`)
		e.waitState(t, "hook", "k", webhook.StateDelivered)
		if rcv.count() != 2 {
			t.Fatalf("%d requests, want 2", rcv.count())
		}
	})
}
