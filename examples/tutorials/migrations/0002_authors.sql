-- Authors: a tutorial's author_id (the X-User-ID that created it) names a
-- row here once the author has given a name (PUT /api/authors/{id}). The
-- cards index (cards.go) joins it into every tutorial's card, so renaming
-- an author changes the cards of all their tutorials.

CREATE TABLE IF NOT EXISTS {{schema}}.authors (
    id         text PRIMARY KEY,
    name       text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS tutorials_author_id ON {{schema}}.tutorials (author_id);
