package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/documents"
	"github.com/outboxd/outboxd/schema"
)

// The cards index sits beside the event-fed tutorials index, and shows
// the other way of feeding one: its documents are not appended by this
// service but declared once, as SQL over two tables, and outboxd builds
// them (package documents). A tutorial's card carries its author's name
// from the authors table: the service writes a tutorial or renames an
// author in its own tables only, the watches outboxd installed on both
// tables append the refreshes, and the relay reads the cards again, all of
// that author's tutorials for a rename. No code in this service builds a
// card.

// DefaultCardsIndex is the definition-fed index of tutorial cards.
const DefaultCardsIndex = "tutorial-cards"

// Card is a tutorial as the cards index holds it.
type Card struct {
	ID       string   `json:"id"`
	Title    string   `json:"title"`
	Tags     []string `json:"tags"`
	AuthorID string   `json:"author_id"`
	Author   string   `json:"author"` // the author's name, or their id until they give one
}

// cardsSQL is the cards' definition (the card of each live tutorial whose
// id is in $1, a text[]) and its ids query (every live tutorial).
func cardsSQL(tables string) (definition, ids string) {
	definition = `SELECT t.id::text, jsonb_build_object('id', t.id, 'title', t.title, 'tags', to_jsonb(t.tags),
		'author_id', t.author_id, 'author', coalesce(a.name, t.author_id), 'updated_at', t.updated_at)
	FROM ` + tables + `.tutorials t LEFT JOIN ` + tables + `.authors a ON a.id = t.author_id
	WHERE t.id = ANY($1::text[]::uuid[]) AND t.deleted_at IS NULL`
	return definition, `SELECT id FROM ` + tables + `.tutorials WHERE deleted_at IS NULL`
}

// DeclareCards declares the cards index in the outbox schema: its
// definition, and the watches that refresh a card when its tutorial
// changes and every card of an author when the author is renamed. It
// changes only what differs from what is declared, so it runs at every
// start (after Migrate). Existing tutorials get their cards from
// `outboxd backfill --index <cards>`; new writes get them from the relay.
func DeclareCards(ctx context.Context, pool *pgxpool.Pool, tablesSchema, outboxSchema, index, operator string) error {
	tables, err := schema.Ident(tablesSchema)
	if err != nil {
		return err
	}
	definition, ids := cardsSQL(tables)
	d, err := documents.Lookup(ctx, pool, outboxSchema, index)
	if err != nil {
		return err
	}
	if d == nil || d.SQL != definition || d.IDsSQL != ids {
		if _, err := documents.Define(ctx, pool, outboxSchema, documents.DefineOptions{Index: index, SQL: definition, IDsSQL: ids, Operator: operator}); err != nil {
			return fmt.Errorf("tutorials: cards: %w", err)
		}
	}
	declared, err := documents.Get(ctx, pool, outboxSchema, index)
	if err != nil {
		return err
	}
	for _, w := range []struct{ table, key string }{
		{tables + ".tutorials", "id"},
		{tables + ".authors", "SELECT t.id FROM " + tables + ".tutorials t WHERE t.author_id = $1.id"},
	} {
		if watched(declared.Watches, w.table, w.key) {
			continue
		}
		if _, err := documents.AddWatch(ctx, pool, outboxSchema, documents.WatchOptions{Index: index, Table: w.table, Key: w.key, Operator: operator}); err != nil {
			return fmt.Errorf("tutorials: cards: %w", err)
		}
	}
	return nil
}

// watched reports whether table is watched with key. The catalog names a
// table as regclass prints it, quoted only where needed; the schema names
// this service accepts contain no double quote, so comparing without
// quotes is exact.
func watched(ws []documents.Watch, table, key string) bool {
	for _, w := range ws {
		if w.Key == key && strings.ReplaceAll(w.Table, `"`, "") == strings.ReplaceAll(table, `"`, "") {
			return true
		}
	}
	return false
}
