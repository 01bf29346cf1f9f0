package scan

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/tooltest"
)

// TestScanKeepsPointInTimeWhileSinkWaits: a page whose documents wait on
// the sink far longer than the point in time's keep_alive (past the
// node's once-a-minute reaper of expired contexts) does not lose the scan.
func TestScanKeepsPointInTimeWhileSinkWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 70s past a point in time's keep_alive")
	}
	t.Parallel()
	ri := tooltest.NewFamily(t, false)
	for i := range 20 {
		ri.Put(t, ri.Write, fmt.Sprintf("d%02d", i), 1, `{}`)
	}
	ri.Refresh(t)
	seen := 0
	err := Each(context.Background(), ri.ES, Options{Indices: []string{ri.Write}, PageSize: 5, KeepAlive: time.Second}, func(Hit) error {
		seen++
		if seen == 1 {
			time.Sleep(70 * time.Second) // a sink under backpressure
		}
		return nil
	})
	if _, openSearch, serr := indexer.Server(context.Background(), ri.ES); serr == nil && openSearch {
		// OpenSearch scans by scroll, which nothing keeps alive between
		// pages: the expiry must be reported as such.
		if err == nil || !strings.Contains(err.Error(), "the scroll expired") {
			t.Fatalf("scan on OpenSearch: %d documents, %v; want the scroll's expiry named", seen, err)
		}
		return
	}
	if err != nil || seen != 20 {
		t.Fatalf("scan: %d documents, %v", seen, err)
	}
}
