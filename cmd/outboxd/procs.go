package main

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"time"
)

// A relay at a low rate spends much of its CPU on the Go scheduler handing
// work between threads: every poll, bulk answer and timer wakes a goroutine,
// and with a second P idle the runtime wakes another thread to look for
// more (futex wake-ups and context switches, which cost a virtual machine
// dearly). Measured on 2 cores, alternating binaries: an idle relay process
// used 0.67-0.70% of a core instead of 0.83-0.87%, and 10-25% less CPU at
// 5,000 events/s. One P caps what the process can use at one core, which a
// backlog needs more of, so the relay runs on one P only while it is quiet,
// and on all of them as soon as it is busy.
const (
	quietCores   = 0.25            // CPU below which a second counts as quiet
	busyCores    = 0.5             // CPU above which a second gives back every P
	quietSeconds = 5               // quiet seconds in a row before one P
	procsPeriod  = 1 * time.Second // how often the process's CPU is read
)

// governScheduler is set by main: GOMAXPROCS belongs to the whole process,
// and a relay run in-process by a test shares it with every other test.
var governScheduler bool

// procs decides the number of Ps from the CPU the process used.
type procs struct {
	all   int // GOMAXPROCS at start
	quiet int // quiet periods in a row
}

// next returns the Ps for the coming period, given the current number and
// the cores the process used in the last period.
func (p *procs) next(cur int, used float64) int {
	switch {
	case used > busyCores:
		p.quiet = 0
		return p.all
	case used < quietCores:
		p.quiet++
		if p.quiet >= quietSeconds {
			return 1
		}
	default:
		p.quiet = 0
	}
	return cur
}

// governProcs runs the scheduler on one P while the process is quiet and
// on all of them while it is busy, until ctx ends. GOMAXPROCS in the
// environment is the operator's choice and turns this off. "All" is the
// runtime's default (runtime.SetDefaultGOMAXPROCS), which keeps following
// the container's CPU limit.
func governProcs(ctx context.Context, log *slog.Logger) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	last, ok := cpuTime()
	if !ok {
		return
	}
	p := &procs{all: runtime.GOMAXPROCS(0)}
	if p.all <= 1 {
		return
	}
	defer runtime.SetDefaultGOMAXPROCS()
	tick := time.NewTicker(procsPeriod)
	defer tick.Stop()
	cur, at := p.all, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c, ok := cpuTime()
		if !ok {
			return
		}
		now := time.Now()
		used := (c - last).Seconds() / max(now.Sub(at).Seconds(), 1e-3)
		last, at = c, now
		n := p.next(cur, used)
		if n == cur {
			continue
		}
		if n == p.all {
			runtime.SetDefaultGOMAXPROCS()
			n = runtime.GOMAXPROCS(0)
			p.all = n
		} else {
			runtime.GOMAXPROCS(n)
		}
		log.Debug("scheduler processors", "procs", n, "cpu_cores", used)
		cur = n
	}
}
