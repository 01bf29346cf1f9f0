package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
)

// CopyItem is one document an operator tool (outboxd rebuild) copies into
// a concrete index at its own version.
type CopyItem struct {
	ID      string
	Version int64
	Source  []byte // one line of JSON; see CopyItemOf
}

// CopyReject is a document the target index will never take, with why.
type CopyReject struct {
	ID     string
	Reason string
}

// CopyItemOf turns an event into the document a copy writes: its
// document, or for a delete a tombstone stamped deletedAt. The reason is
// non-empty, and the item unusable, for an event the sink would reject.
func CopyItemOf(e outbox.Event, deletedAt string) (CopyItem, string) {
	if reason := checkEvent(&e, false); reason != "" {
		return CopyItem{}, reason
	}
	it := CopyItem{ID: e.SourceID, Version: e.Version}
	if e.Op == outbox.OpDelete {
		it.Source = appendTombstone(nil, deletedAt)
	} else {
		it.Source = oneLine(e.Document)
	}
	return it, ""
}

// IndexBody returns the settings and mappings of a new concrete index for
// spec ({"settings":...,"mappings":...}), with the outboxd fields merged in.
func IndexBody(spec []byte) ([]byte, error) { return indexBody(spec) }

// CopyVersioned writes items to the concrete index with version_type
// external_gte at each item's version, the gate's rule (see gate.go) for
// writes that carry a version already decided: the same version again
// overwrites, an older one is a conflict and loses to what the index holds.
// It returns how many items the index took (written, or already holding a
// newer version), those to try again (429, 408, 5xx of an item; none when
// last), and those refused for good (400 and 413 of an item, or of a request
// halved down to that item). A whole request answered 429, 408 or 5xx, or
// no answer, is an *UnavailableError: the cluster's state, not the items'.
func CopyVersioned(ctx context.Context, es *elasticsearch.Client, index string, items []CopyItem, last bool) (taken int64, again []CopyItem, rejected []CopyReject, err error) {
	bp := getBody()
	defer putBody(bp)
	b := (*bp)[:0]
	for _, d := range items {
		b = append(b, `{"index":{"_index":`...)
		b = appendString(b, index)
		b = append(b, `,"_id":`...)
		b = appendString(b, d.ID)
		b = append(b, `,"version":`...)
		b = strconv.AppendInt(b, d.Version, 10)
		b = append(b, `,"version_type":"external_gte"}}`+"\n"...)
		b = append(b, d.Source...)
		b = append(b, '\n')
	}
	*bp = b
	v, err := serverOf(ctx, es)
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			return 0, nil, nil, err
		}
		return 0, nil, nil, &UnavailableError{Err: err}
	}
	req := esapi.BulkRequest{Body: bytes.NewReader(b), FilterPath: bulkFilterPath}
	if v.sourceOnErrorParam() {
		req.IncludeSourceOnError = &ptrFalse
	}
	res, err := req.Do(ctx, es)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, nil, ctx.Err()
		}
		return 0, nil, nil, &UnavailableError{Err: err}
	}
	rb := getBody()
	defer putBody(rb)
	body, err := readAll(res, rb)
	switch {
	case err != nil:
		return 0, nil, nil, &UnavailableError{Err: err}
	case res.StatusCode == http.StatusOK && allSucceeded(body):
		return int64(len(items)), nil, nil, nil
	case res.StatusCode == http.StatusOK:
		var r bulkResponse
		if err := json.Unmarshal(body, &r); err != nil || len(r.Items) != len(items) {
			return 0, items, nil, nil
		}
		for i := range r.Items {
			c, reason := classify(&r.Items[i].Index)
			switch {
			case c == classApplied, c == classConflict:
				taken++
			case c == classRetry && !last:
				again = append(again, items[i])
			case r.Items[i].Index.Status == http.StatusNotFound:
				return taken, nil, rejected, fmt.Errorf("indexer: copy: the index %s vanished: %s", index, reason)
			default:
				rejected = append(rejected, CopyReject{items[i].ID, reason})
			}
		}
		return taken, again, rejected, nil
	case (res.StatusCode == http.StatusBadRequest || res.StatusCode == http.StatusRequestEntityTooLarge) && len(items) > 1:
		h := len(items) / 2
		n1, a1, r1, err := CopyVersioned(ctx, es, index, items[:h], last)
		if err != nil {
			return n1, nil, r1, err
		}
		n2, a2, r2, err := CopyVersioned(ctx, es, index, items[h:], last)
		return n1 + n2, append(a1, a2...), append(r1, r2...), err
	case res.StatusCode == http.StatusBadRequest || res.StatusCode == http.StatusRequestEntityTooLarge:
		return 0, nil, []CopyReject{{items[0].ID, responseError("bulk", res.StatusCode, body).Error()}}, nil
	case res.StatusCode == http.StatusTooManyRequests || res.StatusCode == http.StatusRequestTimeout || res.StatusCode >= 500:
		return 0, nil, nil, &UnavailableError{Err: responseError("copy bulk", res.StatusCode, body)}
	}
	return 0, nil, nil, responseError("copy bulk", res.StatusCode, body)
}
