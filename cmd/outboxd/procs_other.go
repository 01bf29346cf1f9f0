//go:build !unix

package main

import "time"

// cpuTime is not read here: without it the scheduler keeps every P.
func cpuTime() (time.Duration, bool) { return 0, false }
