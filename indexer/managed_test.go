package indexer

import (
	"context"
	"slices"
	"testing"
)

func TestManagedIndexes(t *testing.T) {
	t.Parallel()

	t.Run("indexes with a write and a read alias are listed, a lone -read alias is not", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		mustWrite(t, newSink(t, Options{Client: es}), upsert(name, "a", 1, `{}`))
		other := name + "x"
		t.Cleanup(func() { dropIndices(t, es, other) })
		if st, b := esCall(t, es, "PUT", "/"+FirstIndex(other), `{"aliases":{"`+other+`-read":{}}}`); st != 200 {
			t.Fatalf("create %s: %d %s", other, st, b)
		}
		names, err := ManagedIndexes(context.Background(), es)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(names, name) || slices.Contains(names, other) {
			t.Fatalf("ManagedIndexes = %v; want %s listed and %s not", names, name, other)
		}
	})
}
