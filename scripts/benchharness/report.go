package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

// report prints as it goes and repeats the key numbers and the goal marks
// in a summary at the end.
type report struct {
	mu    sync.Mutex
	keys  []string
	goals []string
}

func newReport() *report { return &report{} }

func (r *report) header(s string) {
	fmt.Println(s)
	fmt.Println(strings.Repeat("=", min(len(s), 100)))
}

func (r *report) section(name string) {
	fmt.Printf("\n== %s ==\n", name)
}

func (r *report) line(format string, args ...any) {
	fmt.Printf("  "+format+"\n", args...)
	os.Stdout.Sync()
}

// key records a headline number for the summary (and prints it).
func (r *report) key(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	r.line("%s", s)
	r.mu.Lock()
	r.keys = append(r.keys, s)
	r.mu.Unlock()
}

// goal records a goal mark: met or MISSED, with the measured value.
func (r *report) goal(met bool, format string, args ...any) {
	mark := "met   "
	if !met {
		mark = "MISSED"
	}
	s := fmt.Sprintf("[%s] ", mark) + fmt.Sprintf(format, args...)
	r.line("%s", s)
	r.mu.Lock()
	r.goals = append(r.goals, s)
	r.mu.Unlock()
}

func (r *report) summary() {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Printf("\n== summary ==\n")
	for _, k := range r.keys {
		fmt.Println("  " + k)
	}
	if len(r.goals) > 0 {
		fmt.Println("\n  goals:")
		for _, g := range r.goals {
			fmt.Println("  " + g)
		}
	}
}

// rate formats events per second.
func rate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM/s", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk/s", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk/s", v/1e3)
	}
	return fmt.Sprintf("%.0f/s", v)
}

func mb(kb int64) string { return fmt.Sprintf("%.1f MB", float64(kb)/1024) }

// loadAvg is the 1-minute load average: other engineers share this
// machine, and a busy moment explains a slow number.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
