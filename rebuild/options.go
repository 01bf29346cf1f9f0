package rebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/internal/progress"
	"github.com/outboxd/outboxd/internal/source"
)

// Rebuild phases, as stored in the rebuilds table.
const (
	PhaseCopying    = "copying"
	PhaseCatchingUp = "catching_up"
	PhaseSwapped    = "swapped"
	PhaseDone       = "done"
	PhaseAborted    = "aborted"
)

// Options says which index is rebuilt, into what, and from where.
type Options struct {
	Pool   *pgxpool.Pool
	Schema string // the outbox schema, which holds the rebuilds table
	ES     *elasticsearch.Client
	// Index is the index name N; the concrete index behind N-write is
	// rebuilt into the next one (N-000002 after N-000001, ...).
	Index string
	// Mappings and Settings of the new index (JSON objects, optionally
	// wrapped as {"mappings":...} / {"settings":...}); nil keeps the
	// current index's.
	Mappings, Settings []byte
	// From is "index" (default: copy the current index) or "source"
	// (SourceSQL, plus the current index's tombstones).
	From string
	// SourceSQL returns id, version, document and optionally a boolean
	// deleted column, like backfill.Options.SourceSQL. Empty with
	// from=source for a definition-fed index (package documents): the new
	// index is filled from its definition, each batch at the version of
	// its read (see definition.go); such an index refuses a SourceSQL.
	SourceSQL string
	// AcceptRejected swaps even when the new index refused documents.
	AcceptRejected bool
	// Keep is how long the old index is kept after the swap; a later
	// rebuild of the same name drops it once that has passed. 0 keeps it
	// until DropOld.
	Keep time.Duration
	// SwapDelta: catch-up rounds repeat until one copies at most this many
	// documents (default 1000), a round shrinks by less than a quarter (the
	// floor the write rate sets), or MaxRounds (default 20) have run. It
	// only bounds how much the final catch-up has to do.
	SwapDelta int
	MaxRounds int
	// Grace is how long the final catch-up waits after the swap for bulk
	// requests that resolved N-write before it moved; default 2s.
	Grace         time.Duration
	Batch         int           // documents per bulk request; default 1000
	Workers       int           // bulk requests at once; default 4
	SourceTimeout time.Duration // statement timeout of each cursor fetch; default 10m
	OutageTimeout time.Duration // how long Elasticsearch may be unreachable; default 5m
	Progress      *progress.Bar
	Logger        *slog.Logger // nil discards

	def *documents.Definition // with from=source: the index's definition, looked up by Run
}

func (o *Options) defaults() error {
	switch {
	case o.Pool == nil:
		return errors.New("indexer: rebuild: pool: no PostgreSQL pool")
	case o.ES == nil:
		return errors.New("indexer: rebuild: client: no Elasticsearch client")
	}
	if err := indexer.CheckName(o.Index); err != nil {
		return err
	}
	switch o.From {
	case "", "index":
		o.From = "index"
		if strings.TrimSpace(o.SourceSQL) != "" {
			return errors.New("indexer: rebuild: source_sql: only used with from=source")
		}
	case "source":
		// SourceSQL, or the index's definition: see lookup.
	default:
		return fmt.Errorf("indexer: rebuild: from: must be \"index\" or \"source\", got %q", o.From)
	}
	if o.Keep < 0 {
		return fmt.Errorf("indexer: rebuild: keep: must not be negative, got %s", o.Keep)
	}
	if o.SwapDelta == 0 {
		o.SwapDelta = 1000
	}
	if o.MaxRounds <= 0 {
		o.MaxRounds = 20
	}
	if o.Grace <= 0 {
		o.Grace = 2 * time.Second
	}
	if o.Batch <= 0 {
		o.Batch = 1000
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.SourceTimeout <= 0 {
		o.SourceTimeout = 10 * time.Minute
	}
	if o.OutageTimeout <= 0 {
		o.OutageTimeout = 5 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// hash identifies what the new index is built from, so a rerun with other
// options does not continue a rebuild it did not start.
func (o *Options) hash() string {
	h := sha256.New()
	src := o.SourceSQL
	if o.def != nil {
		src = source.DefinitionHash(o.def)
	}
	for _, b := range [][]byte{o.Mappings, o.Settings, []byte(o.From), []byte(src)} {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Report is what Run did.
type Report struct {
	Index      string          `json:"index"`
	Run        string          `json:"run"` // this run's id, stored as the row's run_id`
	OldIndex   string          `json:"old_index"`
	NewIndex   string          `json:"new_index"`
	Resumed    string          `json:"resumed_phase,omitempty"`
	Copied     int64           `json:"copied"`
	CaughtUp   int64           `json:"caught_up"`
	Rounds     int             `json:"catch_up_rounds"`
	Rejected   int64           `json:"rejected"`
	Samples    []source.Reject `json:"rejected_samples,omitempty"`
	Swapped    bool            `json:"swapped"`
	DroppedOld []string        `json:"dropped_old,omitempty"`
	Seconds    float64         `json:"seconds"`
}

// RejectedError is returned when the new index refused documents and
// AcceptRejected is false: nothing was swapped, and the rebuild can be
// continued with AcceptRejected or aborted.
type RejectedError struct {
	Index    string
	Rejected int64
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("indexer: rebuild %s: the new index refused %d documents; not swapped (fix the mapping and abort, or accept the rejected documents)", e.Index, e.Rejected)
}
