// Package outbox is what application code imports to publish changes to
// Elasticsearch: append an Event in the same transaction as the business
// row, and outboxd's relay delivers it after the commit, in order.
//
//	ob, err := outbox.NewOutbox("") // the "outbox" schema; see schema.Migrate
//	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE tutorials SET title = $2, version = version + 1 WHERE id = $1`, id, title); err != nil {
//			return err
//		}
//		_, err := ob.Append(ctx, tx, outbox.Event{IndexName: "tutorials", SourceID: id,
//			Op: outbox.OpUpsert, Document: doc}) // Version 0: the next version of tutorials/id
//		return err // a refused event fails the transaction: no row without its event
//	})
//
// Events carry a version per (IndexName, SourceID); the highest version
// wins in Elasticsearch whatever the delivery order (see package indexer).
// Validate checks an event without a database; Append refuses what it
// would refuse, with a *ValidationError naming the field. Queue adds the
// append to a pgx.Batch, AppendBatch appends many in one round trip.
//
// Outcome and Status are what a sink (package indexer) answers per event;
// the relay engine (package relay) acts on them. The outbox tables
// themselves are defined in package schema.
package outbox
