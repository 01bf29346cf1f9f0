package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/elastic/go-elasticsearch/v8/esapi"
)

// readAll reads and closes res.Body into the pooled buffer buf.
func readAll(res *esapi.Response, buf *[]byte) ([]byte, error) {
	defer res.Body.Close()
	bb := bytes.NewBuffer((*buf)[:0])
	_, err := bb.ReadFrom(res.Body)
	*buf = bb.Bytes()
	return *buf, err
}

// responseError turns an error answer into a *ResponseError, keeping
// Elasticsearch's type and reason when the body has them.
func responseError(op string, status int, body []byte) *ResponseError {
	re := &ResponseError{Op: op, Status: status}
	var r struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &r) == nil && len(r.Error) > 0 {
		var e ESError
		if json.Unmarshal(r.Error, &e) == nil && e.Type != "" {
			re.Type = e.Type
			re.Reason = e.Reason
			if e.CausedBy != nil && e.CausedBy.Reason != "" {
				re.Reason += " (caused by " + e.CausedBy.Type + ": " + e.CausedBy.Reason + ")"
			}
			return re
		}
		var s string
		if json.Unmarshal(r.Error, &s) == nil {
			re.Reason = s
			return re
		}
	}
	const max = 300
	if len(body) > max {
		body = body[:max]
	}
	re.Reason = string(bytes.TrimSpace(body))
	if re.Reason == "" {
		re.Reason = "no body"
	}
	return re
}

// perform runs req and returns the body of a 2xx answer, or a *ResponseError,
// or the transport's error. For the small control requests of bootstrap,
// purge and ping; bulk has its own loop.
func perform(ctx context.Context, es esapi.Transport, op string, req esapi.Request) ([]byte, error) {
	res, err := req.Do(ctx, es)
	if err != nil {
		return nil, fmt.Errorf("indexer: %s: %w", op, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("indexer: %s: reading the answer: %w", op, err)
	}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return body, responseError(op, res.StatusCode, body)
	}
	return body, nil
}

// Perform is perform for the operator tools (packages repair, rebuild,
// backfill, reconcile).
func Perform(ctx context.Context, es esapi.Transport, op string, req esapi.Request) ([]byte, error) {
	return perform(ctx, es, op, req)
}
