package indexer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/elastic/go-elasticsearch/v8/esapi"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/schema/schematest"
)

// BenchmarkIndexer compares, against the real Elasticsearch and in one run:
//
//	raw:   a plain _bulk loader (unversioned index actions, 1000 docs a
//	       request, 4 in flight): the ceiling on this machine;
//	sink:  Sink.Write with versioned events in pages of 2000, as the relay
//	       hands them over;
//	naive: one index request per event, one at a time: the floor.
//
// Each loads OUTBOXD_BENCH_DOCS small documents (default 100000; naive
// loads a fiftieth) into its own fresh index and reports docs/s; the
// parent prints the ratios. Run it once: scripts/bench-indexer, or
// go test -run '^$' -bench Indexer -benchtime 1x ./indexer/
func BenchmarkIndexer(b *testing.B) {
	docs := 100000
	if v := os.Getenv("OUTBOXD_BENCH_DOCS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("OUTBOXD_BENCH_DOCS: %q is not a positive number", v)
		}
		docs = n
	}
	es := client(b, schematest.ElasticsearchURL(b))
	rates := map[string]float64{}
	run := func(kind string, n int, load func(b *testing.B, name string, n int)) {
		b.Run(kind, func(b *testing.B) {
			var rate float64
			for range b.N {
				name := schematest.Name("ixbench-")
				b.Cleanup(func() { dropIndices(b, es, name) })
				if err := Bootstrap(context.Background(), es, name, nil); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				load(b, name, n)
				refresh(b, es, name) // count only what is searchable
				rate = float64(n) / time.Since(start).Seconds()
			}
			b.ReportMetric(rate, "docs/s")
			rates[kind] = rate
		})
	}
	run("raw", docs, func(b *testing.B, name string, n int) { rawLoad(b, es, FirstIndex(name), n) })
	run("sink", docs, func(b *testing.B, name string, n int) { sinkLoad(b, es, name, n) })
	run("naive", max(1, docs/50), func(b *testing.B, name string, n int) { naiveLoad(b, es, name, n) })
	if rates["raw"] > 0 {
		fmt.Printf("indexer benchmark, %d docs: raw %.0f docs/s, sink %.0f docs/s, naive %.0f docs/s (%d docs); sink/raw %.2f, naive/raw %.3f\n",
			docs, rates["raw"], rates["sink"], rates["naive"], max(1, docs/50), rates["sink"]/rates["raw"], rates["naive"]/rates["raw"])
	}
}

func benchDoc(b []byte, i int) []byte {
	b = append(b, `{"title":"document `...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, `","n":`...)
	b = strconv.AppendInt(b, int64(i), 10)
	return append(b, `,"tag":"bench"}`...)
}

func rawLoad(b *testing.B, es *elasticsearch.Client, index string, n int) {
	const per, workers = 1000, 4
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body []byte
			for from := range next {
				body = body[:0]
				for i := from; i < min(from+per, n); i++ {
					body = append(body, `{"index":{"_index":"`...)
					body = append(body, index...)
					body = append(body, `","_id":"`...)
					body = strconv.AppendInt(body, int64(i), 10)
					body = append(body, "\"}}\n"...)
					body = benchDoc(body, i)
					body = append(body, '\n')
				}
				res, err := esapi.BulkRequest{Body: bytes.NewReader(body), FilterPath: []string{"errors"}}.Do(context.Background(), es)
				if err != nil {
					b.Error(err)
					return
				}
				var out bytes.Buffer
				_, _ = out.ReadFrom(res.Body)
				res.Body.Close()
				if res.StatusCode != 200 || !bytes.Contains(out.Bytes(), []byte(`"errors":false`)) {
					b.Errorf("raw bulk: %d %s", res.StatusCode, out.Bytes())
					return
				}
			}
		}()
	}
	for from := 0; from < n; from += per {
		next <- from
	}
	close(next)
	wg.Wait()
}

func sinkLoad(b *testing.B, es *elasticsearch.Client, name string, n int) {
	s := newSink(b, Options{Client: es})
	const page = 2000
	events := make([]outbox.Event, 0, page)
	for from := 0; from < n; from += page {
		events = events[:0]
		for i := from; i < min(from+page, n); i++ {
			events = append(events, outbox.Event{IndexName: name, SourceID: strconv.Itoa(i), Version: 1, Op: outbox.OpUpsert, Document: benchDoc(nil, i)})
		}
		out, err := s.Write(context.Background(), events)
		if err != nil {
			b.Fatal(err)
		}
		for _, o := range out {
			if o.Status != outbox.Applied {
				b.Fatalf("sink: %v %s", o.Status, o.Reason)
			}
		}
	}
}

func naiveLoad(b *testing.B, es *elasticsearch.Client, name string, n int) {
	for i := range n {
		res, err := esapi.IndexRequest{
			Index:       name,
			DocumentID:  strconv.Itoa(i),
			Body:        bytes.NewReader(benchDoc(nil, i)),
			Version:     ptrInt(1),
			VersionType: "external_gte",
		}.Do(context.Background(), es)
		if err != nil {
			b.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode > 299 {
			b.Fatalf("naive: %d", res.StatusCode)
		}
	}
}

func ptrInt(v int) *int { return &v }
