package indexer

import (
	"context"
	"slices"
	"testing"
)

func TestManagedIndexes(t *testing.T) {
	t.Parallel()

	t.Run("indexes in the current and the older layout are listed, lone -read and -write aliases are not", func(t *testing.T) {
		t.Parallel()
		es, name := setup(t)
		mustWrite(t, newSink(t, Options{Client: es}), upsert(name, "a", 1, `{}`))
		old := name + "o"
		t.Cleanup(func() { dropIndices(t, es, old) })
		oldLayout(t, es, old)
		other, other2 := name+"x", name+"y"
		t.Cleanup(func() { dropIndices(t, es, other); dropIndices(t, es, other2) })
		if st, b := esCall(t, es, "PUT", "/"+FirstIndex(other), `{"aliases":{"`+other+`-read":{}}}`); st != 200 {
			t.Fatalf("create %s: %d %s", other, st, b)
		}
		if st, b := esCall(t, es, "PUT", "/"+FirstIndex(other2), `{"aliases":{"`+other2+`-write":{}}}`); st != 200 {
			t.Fatalf("create %s: %d %s", other2, st, b)
		}
		names, err := ManagedIndexes(context.Background(), es)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(names, name) || !slices.Contains(names, old) || slices.Contains(names, other) || slices.Contains(names, other2) {
			t.Fatalf("ManagedIndexes = %v; want %s and %s listed, %s and %s not", names, name, old, other, other2)
		}
	})
}
