package main

import (
	"errors"
	"fmt"
	"log/slog"
)

// refuseAtStart turns the start checks' findings into the relay's
// refusal: every problem of the configuration, each named by its item, as
// outboxd check names it. A transient problem (a server that does not
// answer) is logged and the relay starts: it waits for servers and
// retries, and a relay never exits for an outage.
func refuseAtStart(log *slog.Logger, findings ...finding) error {
	var errs []error
	for _, f := range findings {
		switch {
		case f.problem() && f.transient:
			log.Warn("start check not passed; starting anyway, the relay retries", "item", f.item, "err", f.err)
		case f.problem():
			errs = append(errs, fmt.Errorf("start check: %s: %w", f.item, f.err))
		case !f.skipped:
			log.Debug("start check passed", "item", f.item, "found", f.detail)
		}
	}
	return errors.Join(errs...)
}
