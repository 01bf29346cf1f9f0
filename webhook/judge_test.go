package webhook

import (
	"errors"
	"testing"
)

func TestAnswerRule(t *testing.T) {
	lost := errors.New("connection reset by peer")
	cases := []struct {
		name     string
		x        exchange
		retry5xx bool
		want     verdict
	}{
		{"refused before any byte was written", exchange{err: lost}, false, vRetry},
		{"2xx", exchange{wrote: true, status: 204}, false, vDelivered},
		{"408", exchange{wrote: true, status: 408}, false, vRetry},
		{"429", exchange{wrote: true, status: 429}, false, vRetry},
		{"500 after the request was written", exchange{wrote: true, status: 500}, false, vUncertain},
		{"502", exchange{wrote: true, status: 502}, false, vUncertain},
		{"504", exchange{wrote: true, status: 504}, false, vUncertain},
		{"503 with retry_5xx", exchange{wrote: true, status: 503}, true, vRetry},
		{"timeout or reset after the request was written", exchange{wrote: true, err: lost}, false, vUncertain},
		{"timeout after writing, retry_5xx changes nothing", exchange{wrote: true, err: lost}, true, vUncertain},
		{"a kept-alive connection the receiver closed before the request was registered", exchange{wrote: true, err: errors.New(`Post "http://x": http: server closed idle connection`)}, false, vRetry},
		{"3xx", exchange{wrote: true, status: 301}, false, vRefused},
		{"4xx", exchange{wrote: true, status: 422}, false, vRefused},
		{"a status outside HTTP's", exchange{wrote: true, status: 700}, false, vUncertain},
	}
	for _, c := range cases {
		if got := judge(c.x, c.retry5xx); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, resultNames[got], resultNames[c.want])
		}
	}
}
