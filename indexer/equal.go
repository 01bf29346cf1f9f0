package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"

	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
)

// resendMark marks, within one Write, an event about to be re-sent with
// external_gte; it never leaves the sink.
const resendMark outbox.Status = -1

// resolveEqual settles events whose strict-external write met a stored
// document at the same version. A replay of the same event finds the same
// content: Stale, nothing written. Different content under the same
// version (a producer reusing a version) is re-sent with external_gte so
// the later write wins; resolveEqual returns those positions.
func (s *Sink) resolveEqual(ctx context.Context, w *write, equal []int) (resend []int) {
	byIndex := make(map[string][]int)
	for _, p := range equal {
		n := w.events[p].IndexName
		byIndex[n] = append(byIndex[n], p)
	}
	for name, ps := range byIndex {
		docs, err := s.stored(ctx, name, w.events, ps)
		if err != nil {
			o := outbox.Outcome{Status: outbox.Retry, Reason: "reading stored versions: " + err.Error()}
			s.settleAll(w, ps, o)
			continue
		}
		for i, p := range ps {
			e, d := &w.events[p], &docs[i]
			switch {
			case d.Found && d.Version > e.Version:
				w.out[p] = outbox.Outcome{Status: outbox.Stale}
			case d.Found && d.Version == e.Version && sameContent(e, d.Source):
				w.out[p] = outbox.Outcome{Status: outbox.Stale}
			default:
				w.out[p] = outbox.Outcome{Status: resendMark}
				resend = append(resend, p)
			}
		}
	}
	return resend
}

type storedDoc struct {
	Found   bool            `json:"found"`
	Version int64           `json:"_version"`
	Source  json.RawMessage `json:"_source"`
}

// stored fetches the stored version and source of each event's document.
func (s *Sink) stored(ctx context.Context, index string, events []outbox.Event, ps []int) ([]storedDoc, error) {
	b := append(make([]byte, 0, 32*len(ps)), `{"ids":[`...)
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, events[p].SourceID)
	}
	b = append(b, "]}"...)
	body, err := Perform(ctx, s.es, "mget", esapi.MgetRequest{
		Index:      index,
		Body:       bytes.NewReader(b),
		FilterPath: []string{"docs.found", "docs._version", "docs._source"},
	})
	if err != nil {
		return nil, err
	}
	var r struct {
		Docs []storedDoc `json:"docs"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, err
	}
	if len(r.Docs) != len(ps) {
		return nil, &ResponseError{Op: "mget", Status: 200, Reason: "answer does not list every id"}
	}
	return r.Docs, nil
}

// sameContent reports whether the stored source is what e would write. A
// tombstone matches any tombstone: only its timestamp can differ.
func sameContent(e *outbox.Event, stored json.RawMessage) bool {
	if e.Op == outbox.OpDelete {
		var t struct {
			Deleted bool `json:"outboxd_deleted"`
		}
		return json.Unmarshal(stored, &t) == nil && t.Deleted
	}
	doc := oneLine(e.Document)
	if bytes.Equal(doc, stored) {
		return true
	}
	return jsonEqual(doc, stored)
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	da := json.NewDecoder(bytes.NewReader(a))
	da.UseNumber()
	db := json.NewDecoder(bytes.NewReader(b))
	db.UseNumber()
	if da.Decode(&x) != nil || db.Decode(&y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
