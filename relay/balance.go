package relay

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The balancer. Relays may serve different streams (every rolling deploy
// that adds a webhook destination adds a stream), so a share counted over
// all relays can leave a stream that only some of them serve without a
// leader while each of those is "at its share". Shares are therefore
// counted per stream, from the relays that can lead it:
//
//   - A relay's fair load is what it carries in the most even split of
//     every live relay's streams among the relays that can lead them (the
//     max-min fair fractional split; see fairLoad). Its share is that load
//     rounded up. With one configuration everywhere this is the old
//     ceil(streams / relays).
//   - A relay with room (it leads fewer streams than its share) stands by
//     for each stream it can lead and does not: it holds a connection
//     with the stream's standby lock, and takes the stream when it can.
//   - A stream no other live relay can lead is this relay's alone: always
//     contended for, never handed away.
//   - A stream nobody leads and nobody with room stands by for is taken,
//     beyond the share, by any relay that can lead it, after one lease
//     interval (three when a standby is there but does not take it): no
//     stream stays unled while a live relay can lead it.
//   - A relay above its share hands a stream over only to a standby (a
//     relay with room that can lead it), one per lease interval, the one
//     with the greatest name first: it never hands a stream to nobody,
//     and neither side then wants it back (the giver stays at or above its
//     share, the taker at or below its own), so relays never fight over a
//     stream.
//
// After a failover the first relay back is alone and leads everything it
// can; as the others return they stand by and it hands streams over until
// it is down to its share.

// look is one reading of the fleet as this relay balances by it. It is
// read at most every quarter lease interval (see Relay.look).
type look struct {
	ok        bool
	share     int                  // streams this relay should lead at most, all of its own included
	exclusive map[string]bool      // streams no other live relay can lead
	led       map[string]bool      // streams some session leads
	standby   map[string]bool      // streams another relay with room stands by for
	unled     map[string]time.Time // streams seen without a leader, since when (over several looks)
}

// room reports whether this relay contends for s as a standby.
func (l *look) room(s string, leading int) bool {
	return l.exclusive[s] || leading < l.share
}

// rescue reports whether this relay, without room, takes s anyway: nobody
// has led it for a lease interval and nobody with room stands by for it,
// or a standby has not taken it in three.
func (l *look) rescue(s string, lease time.Duration) bool {
	if !l.ok || l.led[s] {
		return false
	}
	t, ok := l.unled[s]
	if !ok {
		return false
	}
	unled := time.Since(t)
	return unled >= 3*lease || (unled >= lease && !l.standby[s])
}

// yieldExtra hands back stream when this process leads more than its
// share and another relay with room stands by for it. Of the streams a
// standby waits for, the one with the greatest name goes, so that one
// stream moves at a time; a stream only this process can lead is never
// handed away.
func (r *Relay) yieldExtra(ctx context.Context, member *membership, stream string) bool {
	held := r.Leading()
	if len(held) <= 1 {
		// A share is never below one stream: no need to read the fleet
		// (a query on pg_locks) to know that.
		return false
	}
	l := r.look(ctx, member)
	if !l.ok || len(held) <= l.share || l.exclusive[stream] || !l.standby[stream] {
		return false
	}
	for _, s := range held {
		if s > stream && !l.exclusive[s] && l.standby[s] {
			return false
		}
	}
	return true
}

// fairLoad is the load (num/den streams) of relay self in the max-min fair
// fractional split of the streams among the relays, each stream going
// only to relays that serve it. It is found by peeling off densest sets:
// the set of relays T whose streams-that-only-T-can-lead per relay is the
// greatest carries exactly that many each (no split can do better for
// them, and one does as well); those relays and streams are removed and
// the rest is split the same way. Relays with the same streams are one
// class (they carry the same), so the search runs over sets of classes;
// with more classes than maxClasses it falls back to summing 1/relays that
// serve it over self's streams.
func fairLoad(relays [][]string, self int) (num, den int) {
	type class struct {
		n       int
		streams []string
	}
	var classes []class
	index := map[string]int{}
	selfClass := 0
	for i, streams := range relays {
		set := slices.Clone(streams)
		slices.Sort(set)
		set = slices.Compact(set)
		key := strings.Join(set, "\x00")
		c, ok := index[key]
		if !ok {
			c = len(classes)
			index[key] = c
			classes = append(classes, class{streams: set})
		}
		classes[c].n++
		if i == self {
			selfClass = c
		}
	}
	if len(classes) > maxClasses {
		return crudeLoad(relays, self)
	}
	served := map[string]uint32{} // stream -> classes that serve it
	for c, cl := range classes {
		for _, s := range cl.streams {
			served[s] |= 1 << c
		}
	}
	var masks []uint32
	for _, m := range served {
		masks = append(masks, m)
	}
	rem := uint32(1)<<len(classes) - 1
	for rem != 0 {
		best, bestNum, bestDen := uint32(0), -1, 1
		for t := rem; t != 0; t = (t - 1) & rem {
			n, d := 0, 0
			for _, m := range masks {
				if m&rem != 0 && m&rem&^t == 0 {
					n++
				}
			}
			for c := range classes {
				if t&(1<<c) != 0 {
					d += classes[c].n
				}
			}
			// Greater density wins; on a tie the larger set (the union
			// of the densest sets is densest too).
			if n*bestDen > bestNum*d || (n*bestDen == bestNum*d && d > bestDen) {
				best, bestNum, bestDen = t, n, d
			}
		}
		if best&(1<<selfClass) != 0 {
			return bestNum, bestDen
		}
		for i, m := range masks {
			if m&rem != 0 && m&rem&^best == 0 {
				masks[i] = 0
			}
		}
		rem &^= best
	}
	return len(relays[self]), 1 // not reached: self's class is in some set
}

// maxClasses bounds the search of fairLoad (2^classes sets): more distinct
// stream sets than this at once is far beyond a rolling deploy.
const maxClasses = 10

// crudeLoad is sum over self's streams of 1/(relays serving it), as
// num/den over a common denominator.
func crudeLoad(relays [][]string, self int) (num, den int) {
	count := map[string]int{}
	for _, streams := range relays {
		for _, s := range slices.Compact(slices.Sorted(slices.Values(streams))) {
			count[s]++
		}
	}
	den = 1
	for _, s := range relays[self] {
		den = lcm(den, count[s])
	}
	for _, s := range slices.Compact(slices.Sorted(slices.Values(relays[self]))) {
		num += den / count[s]
	}
	return num, den
}

func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// share rounds a fair load up to whole streams, never below one.
func share(num, den int) int {
	return max(1, (num+den-1)/den)
}

// standBy takes the stream's standby lock on conn: this relay has room
// for the stream and will take it when it can.
func standBy(ctx context.Context, conn *pgx.Conn, key int64) error {
	_, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1)`, key)
	return err
}

// tryLead tries for the stream's lock and, when it is taken and this
// session stood by for the stream, leaves the standby lock in the same
// statement: a leader is nobody's standby.
func tryLead(ctx context.Context, conn *pgx.Conn, key, standby int64, standing bool) (bool, error) {
	if !standing {
		return tryLock(ctx, conn, key)
	}
	var ok bool
	err := conn.QueryRow(ctx, `SELECT CASE WHEN pg_try_advisory_lock($1) THEN pg_advisory_unlock_shared($2) OR true ELSE false END`, key, standby).Scan(&ok)
	return ok, err
}
