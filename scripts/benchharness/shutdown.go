package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// shutdownScenario times `outboxd relay` from SIGTERM to exit: idle, and
// in the middle of draining a backlog, where it first finishes the bulk
// requests it has in flight (the proxy sees when their answers arrive).
func (b *bench) shutdownScenario(ctx context.Context) error {
	proxy, err := b.startESProxy()
	if err != nil {
		return err
	}
	defer proxy.close()

	// Idle.
	w, err := b.startWarmRelay(ctx, proxy, 1)
	if err != nil {
		return err
	}
	defer w.close()
	w.unwatch()
	p := w.p
	time.Sleep(time.Second)
	idle, err := p.stop(30 * time.Second)
	if err != nil {
		return err
	}
	b.rep.key("shutdown: idle outboxd relay exited %s after SIGTERM (load avg %s)", ms(idle), loadAvg())
	b.rep.goal(idle <= time.Second, "idle exit after SIGTERM <= 1 s: %s", ms(idle))

	// Busy.
	n := b.cfg.shutdownN
	s2, err := b.newSchema(ctx)
	if err != nil {
		return err
	}
	index2 := b.newIndexName()
	if _, err := loadBacklog(ctx, b.pool, s2, index2, 1, int64(n), b.cfg.loadTx, b.cfg.loadWorkers); err != nil {
		return err
	}
	at2 := newAckTimes(n)
	defer at2.watch(proxy)()
	p2, err := b.startRelay(ctx, s2, index2, proxy.url)
	if err != nil {
		return err
	}
	defer p2.kill()
	// Well into the drain: a tenth of the backlog, or a second of bulk
	// answers, whichever is later.
	if err := at2.waitAcked(ctx, int64(max(1, n/10)), 5*time.Minute, p2); err != nil {
		return err
	}
	time.Sleep(time.Second)
	if at2.acked.Load() >= int64(n) {
		return fmt.Errorf("the backlog of %d was drained before SIGTERM: raise -shutdown-n", n)
	}
	starts0, inFlight := proxy.starts.Load(), proxy.inFlight.Load()
	sig := time.Now()
	busy, err := p2.stop(60 * time.Second)
	if err != nil {
		return err
	}
	// The in-flight work is what the relay still waited for from
	// Elasticsearch after the signal: until its last bulk answer.
	work := max(time.Duration(proxy.lastAck.Load()-sig.UnixNano()), 0)
	var answers []string
	after := proxy.answersSince(sig)
	for i, a := range after {
		if i == 10 && len(after) > 12 {
			answers = append(answers, fmt.Sprintf("(%d more)", len(after)-11))
			a = after[len(after)-1]
		} else if i > 10 && len(after) > 12 {
			continue
		}
		answers = append(answers, ms(time.Duration(a.at-sig.UnixNano())))
	}
	b.rep.key("shutdown: draining outboxd relay exited %s after SIGTERM; %d bulk requests in flight then, %d sent after it, answers after it at [%s]; %d of %d events acknowledged (load avg %s)",
		ms(busy), inFlight, proxy.starts.Load()-starts0, strings.Join(answers, " "), at2.acked.Load(), n, loadAvg())
	b.rep.goal(busy <= work+time.Second, "busy exit after SIGTERM <= in-flight work + 1 s: %s <= %s + 1 s", ms(busy), ms(work))
	return nil
}
