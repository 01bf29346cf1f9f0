package main

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// 100 on every Linux this runs on.
const clockTick = 10 * time.Millisecond

// procCPU is a process's user+system CPU time from /proc/<pid>/stat, or
// false once the process is gone.
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start with field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	st, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(ut+st) * clockTick, true
}

// localTCPPorts are the local ports of pid's TCP sockets connected to
// remotePort: its client ends of PostgreSQL connections. (Its connections
// to Elasticsearch may use the same local port numbers as someone else's
// PostgreSQL sessions.)
func localTCPPorts(pid, remotePort int) []int {
	dir := "/proc/" + strconv.Itoa(pid)
	fds, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return nil
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(dir + "/fd/" + fd.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"/net/tcp", "/net/tcp6"} {
		f, err := os.Open(dir + table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			_, local, _ := strings.Cut(fields[1], ":")
			_, remote, _ := strings.Cut(fields[2], ":")
			lp, err1 := strconv.ParseInt(local, 16, 32)
			rp, err2 := strconv.ParseInt(remote, 16, 32)
			if err1 == nil && err2 == nil && int(rp) == remotePort {
				ports = append(ports, int(lp))
			}
		}
		f.Close()
	}
	return ports
}

// cpuMeter adds up the CPU time of a relay process and of the PostgreSQL
// backends serving it. The backends are found by the client ports of the
// relay's sockets in pg_stat_activity (the server is local with
// scripts/services, so its backend pids are this machine's). Sessions come
// and go, so it samples often and keeps each pid's largest reading; a
// backend that ends between two samples loses at most one interval.
type cpuMeter struct {
	pid  int
	pool *pgxpool.Pool

	mu    sync.Mutex
	start map[int]time.Duration // first reading of each pid in this window
	last  map[int]time.Duration // largest reading
	self  time.Duration         // relay at the window start
	cur   time.Duration
}

func newCPUMeter(pid int, pool *pgxpool.Pool) *cpuMeter {
	return &cpuMeter{pid: pid, pool: pool}
}

// backends are the server pids of the relay's connections right now.
func (m *cpuMeter) backends(ctx context.Context) []int {
	ports := localTCPPorts(m.pid, int(m.pool.Config().ConnConfig.Port))
	if len(ports) == 0 {
		return nil
	}
	rows, err := m.pool.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE client_port = ANY($1) AND client_addr IN ('127.0.0.1', '::1')`, ports)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var p int
		if rows.Scan(&p) == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// sample reads the relay and its backends once.
func (m *cpuMeter) sample(ctx context.Context) {
	pids := m.backends(ctx)
	self, _ := procCPU(m.pid)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.start == nil {
		return
	}
	m.cur = max(m.cur, self)
	for _, p := range pids {
		c, ok := procCPU(p)
		if !ok {
			continue
		}
		if _, seen := m.start[p]; !seen {
			// A backend first seen inside the window: count what it
			// used since it was forked for the relay, unless it
			// was already there at the window start.
			m.start[p] = 0
		}
		m.last[p] = max(m.last[p], c)
	}
}

// begin opens a measuring window: what the relay and its current backends
// used so far is not counted.
func (m *cpuMeter) begin(ctx context.Context) {
	pids := m.backends(ctx)
	self, _ := procCPU(m.pid)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.start, m.last = map[int]time.Duration{}, map[int]time.Duration{}
	m.self, m.cur = self, self
	for _, p := range pids {
		if c, ok := procCPU(p); ok {
			m.start[p], m.last[p] = c, c
		}
	}
}

// run samples every interval until ctx ends.
func (m *cpuMeter) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.sample(ctx)
		}
	}
}

// end takes a last sample and returns the relay's and its backends' CPU
// time in the window, and how many backends it saw.
func (m *cpuMeter) end(ctx context.Context) (relay, backends time.Duration, n int) {
	m.sample(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	for p, c := range m.last {
		backends += c - m.start[p]
	}
	return m.cur - m.self, backends, len(m.last)
}
