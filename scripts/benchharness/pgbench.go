package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/schema"
)

// tpcbPlain is pgbench's built-in TPC-B-like transaction (pgbench -b
// tpcb-like), written out so the variants can add one statement to it.
const tpcbPlain = `\set aid random(1, 100000 * :scale)
\set bid random(1, 1 * :scale)
\set tid random(1, 10 * :scale)
\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
%sEND;
`

// tpcbDoc is the event's document in every variant: the change as JSON.
const tpcbDoc = `jsonb_build_object('aid', :aid, 'tid', :tid, 'bid', :bid, 'delta', :delta)`

// pgbenchScenario is the comparison a user makes first: pgbench's
// TPC-B-like transaction, alone and with one more statement: a minimal
// hand-written outbox INSERT (bigserial key, text aggregate id, jsonb,
// timestamptz default now(), nothing else), outbox.append with an
// automatic version, and outbox.append with an explicit one. Phases of
// equal length alternate in every round, so a change of the machine's
// load hits every variant alike; each round's ratios compare neighbours.
func (b *bench) pgbenchScenario(ctx context.Context) error {
	cfg := b.cfg
	bin, err := b.pgbenchBinary(ctx)
	if err != nil {
		return err
	}
	s, err := b.newSchema(ctx)
	if err != nil {
		return err
	}
	id, _ := schema.Ident(s)
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+id+`.minimal_outbox (
		id bigserial PRIMARY KEY,
		aggregate_id text NOT NULL,
		payload jsonb NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "benchharness-pgbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The pgbench tables live in the outbox's schema, dropped with it:
	// search_path puts them there, and the outbox's own names are qualified.
	env := append(os.Environ(), "PGOPTIONS=-c search_path="+id)
	start := time.Now()
	init := exec.CommandContext(ctx, bin, "-i", "-q", "-s", strconv.Itoa(cfg.pgbenchScale), b.url)
	init.Env = append(slices.Clone(env), "PGAPPNAME=benchharness-pgbench")
	if out, err := init.CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %v: %s", err, lastLines(string(out), 5))
	}
	b.rep.line("pgbench -i -s %d in %s (%s); %d clients, %d threads, phases of %s, %d rounds of 4 variants",
		cfg.pgbenchScale, time.Since(start).Round(time.Second), s, cfg.pgbenchClients, cfg.pgbenchThreads, cfg.pgbenchPhase, cfg.pgbenchRounds)

	variants := []struct{ name, stmt string }{
		{"plain", ""},
		{"hand-written INSERT", `INSERT INTO ` + id + `.minimal_outbox (aggregate_id, payload) VALUES (:aid, ` + tpcbDoc + `);` + "\n"},
		{"outbox.append", `SELECT ` + id + `.append('accounts', :aid::text, NULL, 'upsert', ` + tpcbDoc + `);` + "\n"},
		{"outbox.append, explicit version", `SELECT ` + id + `.append('accounts', :aid::text, 1, 'upsert', ` + tpcbDoc + `);` + "\n"},
	}
	files := make([]string, len(variants))
	for i, v := range variants {
		files[i] = filepath.Join(dir, fmt.Sprintf("v%d.sql", i))
		if err := os.WriteFile(files[i], []byte(fmt.Sprintf(tpcbPlain, v.stmt)), 0o600); err != nil {
			return err
		}
	}
	tps := make([][]float64, len(variants)) // [variant][round]
	cpu := make([][]float64, len(variants)) // server CPU µs per transaction, [variant][round]
	for round := range cfg.pgbenchRounds {
		var parts []string
		for i, v := range variants {
			res, err := b.pgbenchPhase(ctx, bin, env, files[i], fmt.Sprintf("benchharness-pgbench-%d-%d", round, i))
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			tps[i] = append(tps[i], res.tps)
			part := fmt.Sprintf("%s %.0f tps", v.name, res.tps)
			if res.cpuPerTx > 0 {
				cpu[i] = append(cpu[i], res.cpuPerTx)
				part += fmt.Sprintf(" %.0f µs", res.cpuPerTx)
			}
			parts = append(parts, part)
		}
		b.rep.line("round %d: %s (load avg %s)", round+1, strings.Join(parts, ", "), loadAvg())
	}
	if len(cpu[0]) == cfg.pgbenchRounds {
		// Server CPU is what the statement costs, whatever the other
		// sessions on the machine do to the throughput.
		var parts []string
		for i, v := range variants {
			if len(cpu[i]) != cfg.pgbenchRounds {
				continue
			}
			part := fmt.Sprintf("%s %s µs", v.name, spread(cpu[i], "%.0f"))
			if i > 0 {
				var d []float64
				for r := range cpu[i] {
					d = append(d, cpu[i][r]-cpu[0][r])
				}
				part += fmt.Sprintf(" (+%s)", spread(d, "%.0f"))
			}
			parts = append(parts, part)
		}
		b.rep.key("pgbench server CPU per transaction (its backends, /proc schedstat): %s", strings.Join(parts, "; "))
	} else {
		b.rep.line("server CPU per transaction: not measured (the server's backends are not processes of this machine)")
	}
	ratio := func(i, j int) []float64 {
		var out []float64
		for r := range tps[i] {
			out = append(out, tps[i][r]/tps[j][r])
		}
		return out
	}
	for i, v := range variants {
		line := fmt.Sprintf("pgbench tpcb-like + %s: %s tps", v.name, spread(tps[i], "%.0f"))
		if i > 0 {
			line += fmt.Sprintf("; %sx plain", spread(ratio(i, 0), "%.2f"))
		}
		if i > 1 {
			line += fmt.Sprintf("; %sx hand-written", spread(ratio(i, 1), "%.2f"))
		}
		b.rep.key("%s (load avg %s)", line, loadAvg())
	}
	for _, i := range []int{2, 3} {
		r := median(ratio(i, 1))
		b.rep.goal(r >= 1.0, "pgbench: %s >= 1.0x a hand-written outbox INSERT: %.2fx (median of %d rounds)", variants[i].name, r, cfg.pgbenchRounds)
	}
	return nil
}

type pgbenchResult struct {
	tps      float64
	cpuPerTx float64 // server CPU µs per transaction, 0 when not measured
}

// pgbenchPhase runs one pgbench phase of script as application name app.
// With -P 1 pgbench reports every second; the CPU of its backends
// (/proc/<pid>/schedstat, when the server runs on this machine) is read at
// the first and the last report, and divided by the transactions the
// reports between them count.
func (b *bench) pgbenchPhase(ctx context.Context, bin string, env []string, script, app string) (pgbenchResult, error) {
	cfg := b.cfg
	cmd := exec.CommandContext(ctx, bin, "-n", "-P", "1", "-f", script, "-c", strconv.Itoa(cfg.pgbenchClients), "-j", strconv.Itoa(cfg.pgbenchThreads),
		"-T", strconv.Itoa(int(cfg.pgbenchPhase.Seconds())), b.url)
	cmd.Env = append(slices.Clone(env), "PGAPPNAME="+app)
	var stdout strings.Builder
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return pgbenchResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return pgbenchResult{}, err
	}
	var (
		pids         []int
		first, last  time.Duration // summed backend CPU at the first and last report
		prevT, txSum float64
		tail         []string
	)
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		tail = append(tail[max(0, len(tail)-4):], line)
		m := progressLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		t, _ := strconv.ParseFloat(m[1], 64)
		rate, _ := strconv.ParseFloat(m[2], 64)
		if pids == nil {
			pids = b.backendPIDs(ctx, app, cfg.pgbenchClients)
			if c, ok := schedCPU(pids); ok {
				first, last, prevT = c, c, t
			} else {
				pids = []int{} // not measurable: stop trying
			}
			continue
		}
		if c, ok := schedCPU(pids); ok && len(pids) > 0 {
			txSum += rate * (t - prevT)
			last, prevT = c, t
		}
	}
	if err := cmd.Wait(); err != nil {
		return pgbenchResult{}, fmt.Errorf("pgbench: %v: %s", err, strings.Join(tail, " | "))
	}
	tps, err := pgbenchTPS(stdout.String())
	if err != nil {
		return pgbenchResult{}, err
	}
	res := pgbenchResult{tps: tps}
	if txSum > 0 && last > first {
		res.cpuPerTx = float64((last - first).Microseconds()) / txSum
	}
	return res, nil
}

var progressLine = regexp.MustCompile(`^progress: ([0-9.]+) s, ([0-9.]+) tps`)

// backendPIDs are the server pids of the n sessions named app.
func (b *bench) backendPIDs(ctx context.Context, app string, n int) []int {
	rows, err := b.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil || len(pids) != n {
		return nil
	}
	return pids
}

// schedCPU sums the time on CPU of pids (/proc/<pid>/schedstat, in ns);
// false unless every one is a readable process of this machine.
func schedCPU(pids []int) (time.Duration, bool) {
	if len(pids) == 0 {
		return 0, false
	}
	var sum time.Duration
	for _, p := range pids {
		raw, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/schedstat")
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(raw))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += time.Duration(ns)
	}
	return sum, true
}

// pgbenchBinary is -pgbench, or the server's own pgbench (its BINDIR when
// the server runs on this machine), or the first on PATH.
func (b *bench) pgbenchBinary(ctx context.Context) (string, error) {
	if b.cfg.pgbench != "" {
		return b.cfg.pgbench, nil
	}
	var bindir string
	if err := b.pool.QueryRow(ctx, `SELECT setting FROM pg_config WHERE name = 'BINDIR'`).Scan(&bindir); err == nil {
		if p := filepath.Join(bindir, "pgbench"); fileExists(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("pgbench: not found in the server's BINDIR nor on PATH (install PostgreSQL's client programs or pass -pgbench)")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

var tpsLine = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)

// pgbenchTPS reads the "tps = N (without initial connection time)" line.
func pgbenchTPS(out string) (float64, error) {
	m := tpsLine.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps line: %s", lastLines(out, 5))
	}
	return strconv.ParseFloat(m[1], 64)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread prints the median and, for several values, the min and max.
func spread(v []float64, f string) string {
	if len(v) == 1 {
		return fmt.Sprintf(f, v[0])
	}
	return fmt.Sprintf(f+" (min "+f+", max "+f+")", median(v), slices.Min(v), slices.Max(v))
}
