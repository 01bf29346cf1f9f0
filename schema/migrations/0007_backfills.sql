-- Progress of `outboxd backfill`: one row per index name, so a backfill
-- killed at any point continues after the last key every row up to which
-- Elasticsearch acknowledged.
CREATE TABLE {{schema}}.backfills (
    index_name  text PRIMARY KEY,
    source_hash text NOT NULL,
    last_key    text,
    rows_read   bigint NOT NULL DEFAULT 0,
    applied     bigint NOT NULL DEFAULT 0,
    stale       bigint NOT NULL DEFAULT 0,
    rejected    bigint NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
