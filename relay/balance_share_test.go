package relay

import (
	"fmt"
	"testing"
)

func TestFairLoad(t *testing.T) {
	abc := []string{"s1", "s2", "s3"}
	cases := []struct {
		name   string
		relays [][]string
		want   []string // each relay's load as num/den, in relays' order
		shares []int
	}{
		{"a relay alone carries all its streams", [][]string{abc}, []string{"3/1"}, []int{3}},
		{"relays with the same streams split them evenly", [][]string{abc, abc}, []string{"3/2", "3/2"}, []int{2, 2}},
		{"seven streams over three relays round up to three", [][]string{
			{"p0", "p1", "p2", "p3", "p4", "p5", "w"}, {"p0", "p1", "p2", "p3", "p4", "p5", "w"}, {"p0", "p1", "p2", "p3", "p4", "p5", "w"},
		}, []string{"7/3", "7/3", "7/3"}, []int{3, 3, 3}},
		{"a relay without s2 still carries one of three", [][]string{abc, abc, {"s1", "s3"}}, []string{"3/3", "3/3", "3/3"}, []int{1, 1, 1}},
		{"a stream only one relay serves weighs on it", [][]string{abc, {"s1", "s2"}}, []string{"3/2", "3/2"}, []int{2, 2}},
		{"a relay with three streams of its own carries them, the other the shared one", [][]string{{"s1", "s2", "s3", "s4"}, {"s1"}}, []string{"3/1", "1/1"}, []int{3, 1}},
		{"fewer streams than relays: a share is one", [][]string{{"s"}, {"s"}, {"s"}}, []string{"1/3", "1/3", "1/3"}, []int{1, 1, 1}},
		{"a stream listed twice counts once", [][]string{{"s1", "s1", "s2"}, {"s1", "s2"}}, []string{"2/2", "2/2"}, []int{1, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i := range c.relays {
				n, d := fairLoad(c.relays, i)
				if got := fmt.Sprintf("%d/%d", n, d); got != c.want[i] {
					t.Errorf("relay %d: load %s, want %s", i, got, c.want[i])
				}
				if got := share(n, d); got != c.shares[i] {
					t.Errorf("relay %d: share %d, want %d", i, got, c.shares[i])
				}
			}
		})
	}

	t.Run("with more stream sets than it searches it sums one over the relays serving each stream", func(t *testing.T) {
		var relays [][]string
		for i := range maxClasses + 1 {
			relays = append(relays, []string{"shared", fmt.Sprintf("own-%d", i)})
		}
		n, d := fairLoad(relays, 0)
		if n*(maxClasses+1) != d*(maxClasses+2) {
			t.Fatalf("load %d/%d, want 1 + 1/%d", n, d, maxClasses+1)
		}
	})
}
