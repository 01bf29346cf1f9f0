package indexer

// The version gate: how the sink makes Elasticsearch keep, per document,
// the event with the highest version, whatever order, however often and
// however concurrently the relay delivers them.
//
//  1. Every event is first sent with version_type "external" (strict):
//     Elasticsearch applies it only if its version is above the stored
//     one. Below is a 409 that is the normal outcome of a replay or of
//     reordering: Stale.
//  2. A 409 at the event's own version ("current version [V] is higher or
//     equal to the one provided [V]") means the document already holds
//     version V. The sink reads the stored source back (mget): the same
//     content is a replay of this event, Stale, nothing written.
//  3. Different content under the same version (a producer that reused a
//     version) is re-sent once with "external_gte", so the later write
//     wins, as the outboxd convention (version >= stored) requires.
//  4. A 409 on that re-send means a newer version landed meanwhile: Stale.
//
// Deletes go through the same gate as tombstones (see tombstone.go), so a
// late upsert cannot resurrect a deleted document.

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"

	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
)

// versionType of an index action: external on the first send, externalGTE
// on the one re-send of step 3.
type versionType uint8

const (
	external versionType = iota
	externalGTE
)

// apply runs the gate for the winners of one Write: send strict, resolve
// the equal-version conflicts, re-send those whose content differs.
func (s *Sink) apply(ctx context.Context, w *write, winners []int) {
	s.sendAll(ctx, w, winners, external)
	if len(w.equal) == 0 {
		return
	}
	equal := w.equal
	w.equal = nil
	resend := s.resolveEqual(ctx, w, equal)
	s.sendAll(ctx, w, resend, externalGTE)
}

// conflict settles a 409 from the gate: a newer stored version or a
// conflict on a re-send is Stale; one at the event's own version waits
// for resolveEqual.
func (w *write) conflict(p int, reason string) {
	if cur, prov, ok := ConflictVersions(reason); ok && cur > prov {
		w.out[p] = outbox.Outcome{Status: outbox.Stale}
		return
	}
	if w.resent != nil && w.resent[p] {
		w.out[p] = outbox.Outcome{Status: outbox.Stale}
		return
	}
	w.mu.Lock()
	w.equal = append(w.equal, p)
	w.mu.Unlock()
}

// ConflictVersions reads the two versions out of a version conflict reason
// (strict external or external_gte): "[id]: version conflict, current
// version [5] is higher or equal to the one provided [5]". ok is false when
// the text has another shape; the caller then asks Elasticsearch for the
// stored version.
func ConflictVersions(reason string) (current, provided int64, ok bool) {
	c, ok1 := bracketAfter(reason, "current version [")
	p, ok2 := bracketAfter(reason, "provided [")
	return c, p, ok1 && ok2
}

func bracketAfter(s, marker string) (int64, bool) {
	i := strings.Index(s, marker)
	if i < 0 {
		return 0, false
	}
	s = s[i+len(marker):]
	j := 0
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	if j == 0 || j == len(s) || s[j] != ']' {
		return 0, false
	}
	v, err := strconv.ParseInt(s[:j], 10, 64)
	return v, err == nil
}

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
				if w.resent == nil {
					w.resent = make([]bool, len(w.events))
				}
				w.resent[p] = true
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
	body, err := perform(ctx, s.es, "mget", esapi.MgetRequest{
		Index:      WriteAlias(index),
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
		var t map[string]any
		return json.Unmarshal(stored, &t) == nil && t[TombstoneField] == true
	}
	doc := oneLine(e.Document)
	if bytes.Equal(doc, stored) {
		return true
	}
	return jsonEqual(doc, stored)
}

// JSONEqual reports whether a and b are the same JSON value (key order and
// number spelling aside): what the gate calls the same content.
func JSONEqual(a, b []byte) bool { return jsonEqual(a, b) }

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
