package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/backfill"
	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/rebuild"
)

func init() {
	register("backfill", "load an existing table into an index at bulk speed, through the version gate, while the relay runs", runBackfill)
}

func runBackfill(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("backfill", flag.ContinueOnError)
	db := addDBFlags(fs)
	es := addESFlags(fs)
	index := fs.String("index", "", "index name N the rows are written to (required)")
	sourceSQL := fs.String("source-sql", "", "query returning id, version, document[, deleted] (required, unless N has a document definition: its documents are then loaded from it)")
	restart := fs.Bool("restart", false, "start over instead of continuing an interrupted backfill of this index")
	batch := fs.Int("batch", 4000, "rows per sink write at most")
	batchBytes := fs.Int("batch-bytes", 8<<20, "bytes of ids and documents per sink write at most (a row larger alone is sent alone); memory holds (in-flight + 1) batches")
	inFlight := fs.Int("in-flight", 2, "batches at Elasticsearch at once")
	bulkDocs := fs.Int("bulk-docs", 1000, "documents per Elasticsearch bulk request")
	bulkBytes := fs.Int("bulk-bytes", 5<<20, "bytes per Elasticsearch bulk request")
	workers := fs.Int("bulk-workers", 4, "bulk requests at once per batch")
	sourceTimeout := fs.Duration("source-timeout", 10*time.Minute, "statement timeout of each cursor fetch")
	outage := fs.Duration("outage-timeout", 5*time.Minute, "give up (resumable) after Elasticsearch was unreachable this long")
	indexSpec := fs.String("index-spec", "", "JSON file with {\"settings\":...,\"mappings\":...} if N must be created (give the relay's --index-spec); without it a missing N is refused")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: outboxd backfill --index N --source-sql "SELECT id, version, row_to_json(t) FROM t" [flags]
       outboxd backfill --index N [flags]   (N has a document definition)

Streams every row of the query straight to Elasticsearch as versioned
upserts (a fourth boolean column, when true, writes a delete), with the same
version gate as the relay and without appending outbox events. Run it while
the relay delivers live events: a row older than a live event is stale, and
a row deleted after it was read stays deleted. Rows are read in the order
of the id's own type: return the table's key as it is (id, not id::text)
and they are read through its index, without sorting the table. Progress
is stored in <schema>.backfills after every acknowledged batch; run the
same command again after a crash to continue after the last stored id.
One backfill of an index runs at a time: a second one is refused, naming
the running one.

Without --source-sql, an index with a document definition (outboxd
documents define) is loaded from it: the ids of its ids query (--ids-sql of
documents define), in their own order, are read from the definition in
batches, each read at a version that orders it with the relay's reads, so
a backfilled document never overwrites a refresh read after it and loses
to one read later; an id the definition no longer returns is written as a
tombstone. Resumable in the same way.

Exit status: 0 every row applied or stale; 3 some rows were rejected (listed).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *index == "":
		return fmt.Errorf("index: required (--index N)")
	case *batch < 1 || *batchBytes < 1:
		return fmt.Errorf("batch, batch-bytes: must be at least 1 (got %d, %d)", *batch, *batchBytes)
	}
	esCfg, err := es.config()
	if err != nil {
		return err
	}
	client, err := indexer.NewClient(esCfg)
	if err != nil {
		return err
	}
	pool, err := db.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	defined, err := definitionSource(ctx, pool, db.schema, *index, *sourceSQL)
	if err != nil {
		return err
	}
	spec, err := backfillIndexSpec(ctx, client, *indexSpec, *index, len(esCfg.Addresses))
	if err != nil {
		return err
	}
	// A json or jsonb document column was validated by PostgreSQL (a
	// definition's documents are jsonb): the sink need not parse every
	// document again.
	validJSON := defined
	if !defined {
		if validJSON, err = backfill.ValidJSON(ctx, pool, *sourceSQL); err != nil {
			return err
		}
	}
	sink, err := indexer.NewSink(indexer.Options{Client: client, MaxBatchDocs: *bulkDocs, MaxBatchBytes: *bulkBytes, Workers: *workers, IndexSpec: spec, JSONB: validJSON, Rebuilt: rebuild.Home(pool, db.schema)})
	if err != nil {
		return err
	}
	prog := progress.New("backfill "+*index, 0, progress.Options{})
	rep, err := backfill.Run(ctx, backfill.Options{
		Pool: pool, Schema: db.schema, Sink: sink, Index: *index, SourceSQL: *sourceSQL, Restart: *restart,
		Batch: *batch, BatchBytes: *batchBytes, InFlight: *inFlight, SourceTimeout: *sourceTimeout, OutageTimeout: *outage, Progress: prog,
	})
	prog.Finish()
	if err != nil {
		return err
	}
	if *asJSON {
		if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
			return err
		}
	} else {
		if rep.From != "" {
			fmt.Printf("continued after id %q\n", rep.From)
		}
		fmt.Printf("index %s: %d rows in %.1fs (%.0f rows/s): %d applied, %d stale, %d rejected\n",
			rep.Index, rep.Rows, rep.Seconds, float64(rep.Rows)/max(rep.Seconds, 1e-9), rep.Applied, rep.Stale, rep.Rejected)
		for _, r := range rep.Samples {
			fmt.Printf("  rejected %q: %s\n", r.ID, r.Reason)
		}
	}
	if rep.Rejected > 0 {
		return &exitError{code: 3, err: fmt.Errorf("%d rows rejected", rep.Rejected)}
	}
	return nil
}

// definitionSource reports whether index's documents come from its
// definition, refusing the --source-sql an index needs when it has none,
// and the one a definition-fed index must not be given: backfill,
// reconcile and rebuild --from source read one or the other.
func definitionSource(ctx context.Context, pool *pgxpool.Pool, schemaName, index, sourceSQL string) (bool, error) {
	def, err := documents.Lookup(ctx, pool, schemaName, index)
	if err != nil {
		return false, err
	}
	switch {
	case def == nil && strings.TrimSpace(sourceSQL) == "":
		return false, fmt.Errorf("source-sql: required: index %s has no document definition to read its documents from (outboxd documents define --index %s --sql-file F --ids-sql SQL), so --source-sql must give the query returning its rows (id, version, document)", index, index)
	case def != nil && strings.TrimSpace(sourceSQL) != "":
		return false, fmt.Errorf("source-sql: index %s is definition-fed: its documents come from its definition (outboxd documents list), at the versions of their reads; leave --source-sql out to use it", index)
	case def != nil:
		return true, def.NeedIDs()
	}
	return false, nil
}

// backfillIndexSpec reads --index-spec, checked as the relay checks its
// own. Without it a missing index is refused: created with the built-in
// single-node spec, it would never get the relay's settings and mappings.
func backfillIndexSpec(ctx context.Context, client *elasticsearch.Client, path, index string, nodes int) ([]byte, error) {
	if path == "" {
		exists, err := indexer.LayoutExists(ctx, client, index)
		if err != nil {
			return nil, err
		}
		if !exists {
			return nil, fmt.Errorf("index-spec: index %s does not exist and backfill would create it; give --index-spec FILE (the relay's --index-spec) so it is created with your settings and mappings, or start the relay first", index)
		}
		return nil, nil
	}
	spec, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("index-spec: %w", err)
	}
	if err := checkIndexSpec(ctx, client, spec, nodes); err != nil {
		return nil, fmt.Errorf("index-spec %s: %w", path, err)
	}
	return spec, nil
}
