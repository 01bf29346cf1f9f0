package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"
)

// A tombstone is the document a delete leaves at its version, so that an
// older upsert arriving late is refused: TombstoneField true, and
// TombstoneAtField when it was written (PurgeTombstones goes by it).
const (
	TombstoneField   = "outboxd_deleted"
	TombstoneAtField = "outboxd_deleted_at"
)

// purgePage bounds the memory of a purge: one page of hits and one bulk
// body at a time.
const purgePage = 1000

// PurgeTombstones deletes the tombstones of index name N (seen through
// N-write, which unlike N shows them) that are older than olderThan, and
// returns how many it deleted.
//
// Each delete is conditional on the tombstone being unchanged since the
// search (if_seq_no + if_primary_term): a document written since, at any
// version, answers 409 and is left alone. After the purge an upsert older than the delete would bring the
// document back, so olderThan must exceed the longest time an event can
// spend between its outbox commit and the sink (outages, dead letters
// retried by hand): days, not minutes.
func PurgeTombstones(ctx context.Context, es *elasticsearch.Client, name string, olderThan time.Duration) (purged int, err error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	if olderThan < 0 {
		return 0, fmt.Errorf("indexer: purge: older_than: must not be negative, got %s", olderThan)
	}
	target, err := writeTarget(ctx, es, name)
	if err != nil {
		return 0, err
	}
	cutoff := time.Now().Add(-olderThan).UTC().Format("2006-01-02T15:04:05.000Z")
	query := `{"size":` + strconv.Itoa(purgePage) + `,"_source":false,"version":true,"seq_no_primary_term":true,"sort":["_doc"],` +
		`"query":{"bool":{"filter":[{"term":{"` + TombstoneField + `":true}},{"range":{"` + TombstoneAtField + `":{"lt":"` + cutoff + `"}}}]}}}`
	// A scroll, not search_after: sorting by _id needs fielddata that
	// Elasticsearch 8 disables, and _doc order is only stable inside a
	// scroll context. Deleting while scrolling is fine: the scroll reads a
	// snapshot.
	filter := []string{"_scroll_id", "hits.hits._index", "hits.hits._id", "hits.hits._version", "hits.hits._seq_no", "hits.hits._primary_term"}
	raw, err := perform(ctx, es, "purge: search tombstones", esapi.SearchRequest{
		Index:      []string{target},
		Body:       strings.NewReader(query),
		Scroll:     time.Minute,
		FilterPath: filter,
	})
	if err != nil {
		return 0, err
	}
	var scrollID string
	defer func() {
		if scrollID == "" {
			return
		}
		// The caller's ctx may be done; a leaked scroll holds segments
		// until it expires.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = perform(cctx, es, "purge: clear scroll", esapi.ClearScrollRequest{ScrollID: []string{scrollID}})
	}()
	for {
		var page struct {
			ScrollID string `json:"_scroll_id"`
			Hits     struct {
				Hits []tombstoneHit `json:"hits"`
			} `json:"hits"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return purged, fmt.Errorf("indexer: purge: reading search answer: %w", err)
		}
		scrollID = page.ScrollID
		if len(page.Hits.Hits) == 0 {
			return purged, nil
		}
		n, err := deleteTombstones(ctx, es, page.Hits.Hits)
		purged += n
		if err != nil {
			return purged, err
		}
		raw, err = perform(ctx, es, "purge: next page", esapi.ScrollRequest{
			ScrollID:   scrollID,
			Scroll:     time.Minute,
			FilterPath: filter,
		})
		if err != nil {
			return purged, err
		}
	}
}

type tombstoneHit struct {
	Index       string `json:"_index"`
	ID          string `json:"_id"`
	Version     int64  `json:"_version"`
	SeqNo       int64  `json:"_seq_no"`
	PrimaryTerm int64  `json:"_primary_term"`
}

// deleteTombstones deletes one page of tombstones, each only if it is still
// the very write the search saw (if_seq_no + if_primary_term): a version
// check alone would also delete a live document written since at the
// tombstone's own version. A 409 means the document changed meanwhile and
// a 404 that someone else purged it: both are skipped, not errors.
func deleteTombstones(ctx context.Context, es *elasticsearch.Client, hits []tombstoneHit) (int, error) {
	b := make([]byte, 0, 128*len(hits))
	for _, h := range hits {
		b = append(b, `{"delete":{"_index":`...)
		b = appendString(b, h.Index)
		b = append(b, `,"_id":`...)
		b = appendString(b, h.ID)
		b = append(b, `,"if_seq_no":`...)
		b = strconv.AppendInt(b, h.SeqNo, 10)
		b = append(b, `,"if_primary_term":`...)
		b = strconv.AppendInt(b, h.PrimaryTerm, 10)
		b = append(b, "}}\n"...)
	}
	raw, err := perform(ctx, es, "purge: bulk delete", esapi.BulkRequest{
		Body:       bytes.NewReader(b),
		FilterPath: []string{"items.*.status", "items.*.error.type", "items.*.error.reason"},
	})
	if err != nil {
		return 0, err
	}
	var r struct {
		Items []struct {
			Delete BulkItem `json:"delete"`
		} `json:"items"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return 0, fmt.Errorf("indexer: purge: reading bulk answer: %w", err)
	}
	n := 0
	var failures []string
	for _, it := range r.Items {
		switch s := it.Delete.Status; {
		case s >= 200 && s < 300:
			n++
		case s == 404 || s == 409:
		default:
			failures = append(failures, "HTTP "+strconv.Itoa(s)+": "+it.Delete.Error.String())
		}
	}
	if len(failures) > 0 {
		return n, fmt.Errorf("indexer: purge: %d deletes failed, first: %s", len(failures), failures[0])
	}
	return n, nil
}

// Ping reports whether Elasticsearch answers, for readiness probes.
func Ping(ctx context.Context, es *elasticsearch.Client) error {
	_, err := perform(ctx, es, "ping", esapi.ClusterHealthRequest{FilterPath: []string{"status"}})
	return err
}
