package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ValidateRefresh checks a refresh's index name and source id against the
// rules of the SQL function refresh. Whether the index has a document
// definition only the database can tell.
func ValidateRefresh(index, sourceID string) error {
	switch {
	case sourceID == "":
		return &ValidationError{"source_id", "must not be empty"}
	case len(sourceID) > 512:
		return &ValidationError{"source_id", fmt.Sprintf("%d bytes, Elasticsearch allows at most 512", len(sourceID))}
	}
	return ValidateIndexName(index)
}

// Refresh appends, inside db (normally the business transaction), the
// event "document sourceID of index may have changed". The relay reads
// that document again from the index's definition (package documents)
// and writes what the definition returns now, or a tombstone when it
// returns nothing. The index must have a definition: otherwise the SQL
// refuses the refresh and the transaction is aborted, as for an invalid
// Append.
func (o *Outbox) Refresh(ctx context.Context, db DB, index, sourceID string) (int64, error) {
	if err := ValidateRefresh(index, sourceID); err != nil {
		return 0, o.refuse(ctx, db, err)
	}
	var id int64
	if err := db.QueryRow(ctx, `SELECT `+o.ident+`.refresh($1, $2)`, index, sourceID).Scan(&id); err != nil {
		return 0, fmt.Errorf("outboxd: refresh: %w", err)
	}
	return id, nil
}

// QueueRefresh adds Refresh to the caller's batch, as Queue does for an
// append.
func (o *Outbox) QueueRefresh(b *pgx.Batch, index, sourceID string) error {
	if err := ValidateRefresh(index, sourceID); err != nil {
		b.Queue(`SELECT `+o.ident+`.refuse($1)`, err.Error())
		return err
	}
	b.Queue(`SELECT `+o.ident+`.refresh($1, $2)`, index, sourceID)
	return nil
}
