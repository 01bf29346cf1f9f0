package main

import "testing"

func TestProcs(t *testing.T) {
	t.Parallel()
	t.Run("one P only after quiet seconds in a row", func(t *testing.T) {
		t.Parallel()
		p := &procs{all: 4}
		cur := 4
		for i := range quietSeconds - 1 {
			if cur = p.next(cur, 0.01); cur != 4 {
				t.Fatalf("after %d quiet seconds: %d Ps, want 4", i+1, cur)
			}
		}
		// A second between quiet and busy starts the count again.
		if cur = p.next(cur, 0.3); cur != 4 {
			t.Fatalf("after a middling second: %d Ps, want 4", cur)
		}
		for range quietSeconds - 1 {
			cur = p.next(cur, 0.01)
		}
		if cur != 4 {
			t.Fatalf("the count did not start again: %d Ps", cur)
		}
		if cur = p.next(cur, 0.01); cur != 1 {
			t.Fatalf("after %d quiet seconds in a row: %d Ps, want 1", quietSeconds, cur)
		}
	})
	t.Run("every P back in the first busy second", func(t *testing.T) {
		t.Parallel()
		p := &procs{all: 2}
		cur := 2
		for range quietSeconds {
			cur = p.next(cur, 0.05)
		}
		if cur != 1 {
			t.Fatalf("%d Ps after quiet seconds, want 1", cur)
		}
		if cur = p.next(cur, 0.3); cur != 1 {
			t.Fatalf("a middling second changed the Ps to %d", cur)
		}
		if cur = p.next(cur, 0.9); cur != 2 {
			t.Fatalf("a busy second left %d Ps, want 2", cur)
		}
		if cur = p.next(cur, 0.01); cur != 2 {
			t.Fatalf("one quiet second after a busy one gave %d Ps, want 2", cur)
		}
	})
}
