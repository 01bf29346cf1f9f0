package scan

import (
	"context"
	"fmt"
	"testing"

	"github.com/outboxd/outboxd/internal/tooltest"
)

func TestScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("every document of both indices is seen once across pages, with its coordinates", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, true)
		for i := 0; i < 23; i++ {
			idx := ri.Write
			if i%3 == 0 {
				idx = ri.Old
			}
			ri.Put(t, idx, fmt.Sprintf("d%02d", i), int64(i+1), `{"title":"x","body":"not requested"}`)
		}
		ri.Refresh(t)
		seen := map[string]Hit{}
		err := Each(ctx, ri.ES, Options{Indices: []string{ri.Write, ri.Old}, PageSize: 5, SourceIncludes: []string{"title"}}, func(h Hit) error {
			if _, dup := seen[h.ID]; dup {
				t.Errorf("%s seen twice", h.ID)
			}
			h.Source = append([]byte(nil), h.Source...)
			seen[h.ID] = h
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) != 23 {
			t.Fatalf("saw %d documents, want 23", len(seen))
		}
		h := seen["d04"]
		if h.Version != 5 || h.PrimaryTerm < 1 || h.Index != ri.Write || string(h.Source) != `{"title":"x"}` {
			t.Fatalf("hit %+v (source %s)", h, h.Source)
		}
	})

	t.Run("writes made during the scan are not seen", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, false)
		for i := 0; i < 6; i++ {
			ri.Put(t, ri.Write, fmt.Sprintf("d%d", i), 1, `{}`)
		}
		ri.Refresh(t)
		n := 0
		err := Each(ctx, ri.ES, Options{Indices: []string{ri.Write}, PageSize: 2}, func(h Hit) error {
			if n == 0 {
				ri.Put(t, ri.Write, "late", 1, `{}`)
				ri.Refresh(t)
			}
			n++
			return nil
		})
		if err != nil || n != 6 {
			t.Fatalf("saw %d documents (%v), want the 6 of the point in time", n, err)
		}
	})

	t.Run("a missing index is a clear error", func(t *testing.T) {
		t.Parallel()
		ri := tooltest.NewFamily(t, false)
		err := Each(ctx, ri.ES, Options{Indices: []string{ri.Name + "-nope"}}, func(Hit) error { return nil })
		if err == nil || !IsStatus(err, 404) {
			t.Fatalf("err %v, want a 404", err)
		}
	})
}
