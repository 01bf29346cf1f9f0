package relay

import (
	"sync"
	"sync/atomic"
)

// StreamKey lets tests take a stream's lock the way a relay does.
var StreamKey = streamKey

// MoveReadPositionAfterFirstPage makes the first leader's reader, after the
// first read that returns events and ends a batch, believe it read up to a
// transaction counter by higher than the database's: the position a leader
// holds in memory when a failover hands its reads to a standby that lacks
// the old primary's newest transactions.
func MoveReadPositionAfterFirstPage(c *Config, by uint64) {
	var once sync.Once
	c.afterRead = func(p *position, _ int) {
		if p.batch == nil && p.done.Xmax > 1 {
			once.Do(func() { p.done.Xmax += by })
		}
	}
}

// CountReads counts the reader's successful page reads that returned
// events in n.
func CountReads(c *Config, n *atomic.Int64) {
	c.afterRead = func(_ *position, events int) {
		if events > 0 {
			n.Add(1)
		}
	}
}

// ObservePolls calls f with the number of events of every successful read
// of the read loop (a linger's reads aside), empty polls included, as the
// read returns.
func ObservePolls(c *Config, f func(events int)) { c.afterPoll = f }
