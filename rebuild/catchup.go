package rebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/scan"
)

// catchUpRounds runs catch-up rounds until one copies at most SwapDelta
// documents, a round shrinks by less than a quarter, or MaxRounds have
// run: what is left is for the final catch-up after the swap.
func (r *runner) catchUpRounds(ctx context.Context, rep *Report) error {
	// Each round copies what was written during the previous one, so
	// rounds shrink until they reach what the write rate adds during a
	// round; more rounds after that gain nothing.
	prev := int64(-1)
	for rep.Rounds < r.o.MaxRounds {
		n, err := r.catchUp(ctx)
		rep.Rounds++
		rep.CaughtUp += n
		if err != nil {
			return err
		}
		r.o.Logger.Info("rebuild caught up", "index", r.o.Index, "round", rep.Rounds, "documents", n)
		if n <= int64(r.o.SwapDelta) || (prev >= 0 && 4*n > 3*prev) {
			break
		}
		prev = n
	}
	return nil
}

// catchUp copies the old index's documents above each shard's checkpoint
// and advances the checkpoints to those read before the refresh: every
// write up to them is then visible and copied.
func (r *runner) catchUp(ctx context.Context) (int64, error) {
	if err := r.st.check(ctx); err != nil {
		return 0, err
	}
	next, err := shardCheckpoints(ctx, r.o.ES, r.cur.Old)
	if err != nil {
		return 0, err
	}
	if _, err := indexer.Perform(ctx, r.o.ES, "refresh "+r.cur.Old, esapi.IndicesRefreshRequest{Index: []string{r.cur.Old}}); err != nil {
		return 0, err
	}
	w := r.newWriter(ctx, false)
	for shard, cp := range r.cur.Checkpoints {
		if err := r.scanShard(ctx, shard, cp, next[shard], w); err != nil {
			return 0, w.abandon(err)
		}
	}
	n, err := w.close()
	if err != nil {
		return n, err
	}
	r.cur.Checkpoints = next
	return n, r.st.setCheckpoints(ctx, next)
}

// scanShard copies one shard's documents with _seq_no in (from, to]. A
// shard numbers its operations densely, so a window of Batch numbers holds
// at most Batch live documents and one request per window reads them all:
// unlike paging through "everything above from" sorted by _seq_no, each
// request costs its window, not the whole rest of the shard. No point in
// time: a document changed meanwhile moves to a higher _seq_no, which a
// later window or the next round sees.
func (r *runner) scanShard(ctx context.Context, shard string, from, to int64, w *copyWriter) error {
	op := "catch up " + r.cur.Old + " shard " + shard
	for lo := from; lo < to; lo += int64(r.o.Batch) {
		body, _ := json.Marshal(map[string]any{
			"size":             r.o.Batch,
			"query":            map[string]any{"range": map[string]any{"_seq_no": map[string]int64{"gt": lo, "lte": min(lo+int64(r.o.Batch), to)}}},
			"version":          true,
			"track_total_hits": false,
		})
		var page struct {
			Hits struct {
				Hits []scan.Hit `json:"hits"`
			} `json:"hits"`
		}
		if err := scan.Do(ctx, r.o.ES, op, esapi.SearchRequest{Index: []string{r.cur.Old}, Preference: "_shards:" + shard, Body: bytes.NewReader(body)}, &page); err != nil {
			return err
		}
		for _, h := range page.Hits.Hits {
			if err := w.add(indexer.CopyItem{ID: h.ID, Version: h.Version, Source: h.Source}); err != nil {
				return err
			}
		}
	}
	return nil
}

// shardCheckpoints returns each shard's global checkpoint: every
// operation up to it has been processed on every in-sync copy, so after a
// later refresh a search sees it whichever copy answers.
func shardCheckpoints(ctx context.Context, es *elasticsearch.Client, index string) (map[string]int64, error) {
	var out struct {
		Indices map[string]struct {
			Shards map[string][]struct {
				Routing struct {
					Primary bool `json:"primary"`
				} `json:"routing"`
				SeqNo struct {
					GlobalCheckpoint int64 `json:"global_checkpoint"`
				} `json:"seq_no"`
			} `json:"shards"`
		} `json:"indices"`
	}
	if err := scan.Do(ctx, es, "shard stats of "+index, esapi.IndicesStatsRequest{Index: []string{index}, Metric: []string{"docs"}, Level: "shards"}, &out); err != nil {
		return nil, err
	}
	cps := map[string]int64{}
	for shard, copies := range out.Indices[index].Shards {
		for _, c := range copies {
			if c.Routing.Primary {
				cps[shard] = c.SeqNo.GlobalCheckpoint
			}
		}
	}
	if len(cps) == 0 {
		return nil, fmt.Errorf("indexer: shard stats of %s: no primary shard reported (is the index red?)", index)
	}
	return cps, nil
}
