package indexer

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
)

type bootEntry struct {
	lock chan struct{} // one bootstrap at a time; a channel, so waiting for it honours ctx
	ok   atomic.Bool
	// wasOK: bootstrapped before in this process, so creating the index
	// now re-creates a layout that vanished (guarded by lock).
	wasOK bool
}

// ensure bootstraps name once per Sink. Failures are not cached: the next
// Write tries again, so an operator's fix is picked up without a restart.
func (s *Sink) ensure(ctx context.Context, name string) error {
	s.mu.Lock()
	e := s.boot[name]
	if e == nil {
		e = &bootEntry{lock: make(chan struct{}, 1)}
		s.boot[name] = e
	}
	s.mu.Unlock()
	if e.ok.Load() {
		return nil
	}
	// Another Write may be bootstrapping name against a node that does not
	// answer; this one must still return by its own deadline.
	select {
	case e.lock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("indexer: bootstrap %s: waiting for another write's bootstrap: %w", name, ctx.Err())
	}
	defer func() { <-e.lock }()
	if e.ok.Load() {
		return nil
	}
	created, err := bootstrap(ctx, s.es, name, s.spec, s.rebuilt)
	if err != nil {
		s.logger.Warn("indexer: bootstrap failed", slog.String("index", name), slog.String("error", err.Error()))
		return err
	}
	switch {
	case created && e.wasOK:
		s.logger.Warn("indexer: re-created the layout of an index that had vanished: "+FirstIndex(name)+" is new and empty; if its documents are in another index, point the aliases back at it",
			slog.String("index", name), slog.String("concrete_index", FirstIndex(name)))
	case created:
		s.logger.Info("indexer: created index", slog.String("index", name), slog.String("concrete_index", FirstIndex(name)))
	}
	e.wasOK = true
	e.ok.Store(true)
	return nil
}

// forget makes the next Write bootstrap name again (its write alias went
// missing).
func (s *Sink) forget(name string) {
	s.mu.Lock()
	e := s.boot[name]
	s.mu.Unlock()
	if e != nil {
		e.ok.Store(false)
	}
}
