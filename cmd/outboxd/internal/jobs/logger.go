package jobs

import (
	"log/slog"

	"github.com/robfig/cron/v3"
)

// cronLogger adapts slog to cron.Logger. cron's Info lines (wake, run,
// schedule) fire on every tick, so they go to Debug.
type cronLogger struct{ l *slog.Logger }

var _ cron.Logger = cronLogger{}

func (c cronLogger) Info(msg string, kv ...any) { c.l.Debug("jobs: cron: "+msg, kv...) }

func (c cronLogger) Error(err error, msg string, kv ...any) {
	c.l.Error("jobs: cron: "+msg, append(kv, "err", err)...)
}
