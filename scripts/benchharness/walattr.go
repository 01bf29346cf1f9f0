package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// walAttributor counts the WAL one schema caused in an LSN range, immune
// to other sessions writing at the same time: it reads the range with
// pg_waldump and keeps the records on the schema's relations plus the
// commit records of the transactions that wrote them. It needs the server
// on this host (the local scripts/services one); otherwise the scenario
// falls back to raw LSN differences.
type walAttributor struct {
	waldump string
	walDir  string
	dbOID   string
}

func newWALAttributor(ctx context.Context, pool *pgxpool.Pool) (*walAttributor, error) {
	var bindir, datadir, db string
	err := pool.QueryRow(ctx, `SELECT (SELECT setting FROM pg_config WHERE name = 'BINDIR'), current_setting('data_directory'),
		(SELECT oid::text FROM pg_database WHERE datname = current_database())`).Scan(&bindir, &datadir, &db)
	if err != nil {
		return nil, err
	}
	a := &walAttributor{waldump: filepath.Join(bindir, "pg_waldump"), walDir: filepath.Join(datadir, "pg_wal"), dbOID: db}
	if _, err := os.Stat(a.waldump); err != nil {
		return nil, fmt.Errorf("pg_waldump: %w", err)
	}
	if _, err := os.ReadDir(a.walDir); err != nil {
		return nil, fmt.Errorf("wal directory: %w", err)
	}
	return a, nil
}

// filenodes lists the relation file nodes of the schema, its TOAST tables
// and their indexes.
func filenodes(ctx context.Context, pool *pgxpool.Pool, schemaName string) (map[string]bool, error) {
	rows, err := pool.Query(ctx, `SELECT pg_relation_filenode(c.oid)::text FROM pg_class c
		WHERE c.relnamespace = $1::regnamespace AND pg_relation_filenode(c.oid) IS NOT NULL
		UNION SELECT pg_relation_filenode(t.oid)::text FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid
		WHERE c.relnamespace = $1::regnamespace
		UNION SELECT pg_relation_filenode(i.indexrelid)::text FROM pg_class c JOIN pg_index i ON i.indrelid = c.reltoastrelid
		WHERE c.relnamespace = $1::regnamespace`, schemaName)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out[n] = true
	}
	return out, rows.Err()
}

func lsnText(v int64) string { return fmt.Sprintf("%X/%X", uint64(v)>>32, uint64(v)&0xffffffff) }

// bytes returns the WAL bytes in [from, to) caused by the schema's
// relations and the commits of their transactions.
func (a *walAttributor) bytes(ctx context.Context, pool *pgxpool.Pool, schemaName string, from, to int64) (int64, error) {
	rels, err := filenodes(ctx, pool, schemaName)
	if err != nil {
		return 0, err
	}
	// pg_waldump reads files: wait until the range is flushed.
	for i := 0; ; i++ {
		var flushed int64
		if err := pool.QueryRow(ctx, `SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&flushed); err != nil {
			return 0, err
		}
		if flushed >= to {
			break
		}
		if i > 100 {
			return 0, fmt.Errorf("WAL up to %s not flushed", lsnText(to))
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd := exec.CommandContext(ctx, a.waldump, "-p", a.walDir, "-s", lsnText(from), "-e", lsnText(to))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	ours := map[string]bool{} // xids that wrote our relations
	var total int64
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	prefix := " rel 1663/" + a.dbOID + "/"
	for sc.Scan() {
		line := sc.Text()
		tot, tx, ok := recordHeader(line)
		if !ok {
			continue
		}
		mine := false
		for rest := line; ; {
			i := strings.Index(rest, prefix)
			if i < 0 {
				break
			}
			rest = rest[i+len(prefix):]
			end := strings.IndexAny(rest, " ,")
			if end < 0 {
				end = len(rest)
			}
			if rels[rest[:end]] {
				mine = true
				break
			}
		}
		switch {
		case mine:
			total += tot
			if tx != "0" {
				ours[tx] = true
			}
		case strings.HasPrefix(line, "rmgr: Transaction") && ours[tx]:
			total += tot
		}
	}
	werr := cmd.Wait()
	if err := sc.Err(); err != nil {
		return 0, err
	}
	// pg_waldump exits 1 when the end record is incomplete at -e; the
	// records it printed are complete.
	if werr != nil && !strings.Contains(stderr.String(), "error in WAL record") && stderr.Len() > 0 {
		return 0, fmt.Errorf("pg_waldump: %v: %s", werr, strings.TrimSpace(stderr.String()))
	}
	return total, nil
}

// recordHeader parses "rmgr: X len (rec/tot): R/ T, tx: N, ...".
func recordHeader(line string) (tot int64, tx string, ok bool) {
	i := strings.Index(line, "len (rec/tot):")
	if i < 0 {
		return 0, "", false
	}
	rest := line[i+len("len (rec/tot):"):]
	slash := strings.IndexByte(rest, '/')
	comma := strings.IndexByte(rest, ',')
	if slash < 0 || comma < slash {
		return 0, "", false
	}
	tot, err := strconv.ParseInt(strings.TrimSpace(rest[slash+1:comma]), 10, 64)
	if err != nil {
		return 0, "", false
	}
	j := strings.Index(rest, "tx:")
	if j < 0 {
		return 0, "", false
	}
	t := strings.TrimSpace(rest[j+3:])
	if k := strings.IndexByte(t, ','); k >= 0 {
		t = t[:k]
	}
	return tot, t, true
}
