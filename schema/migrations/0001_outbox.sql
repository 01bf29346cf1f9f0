-- The outbox itself. Every statement is written against {{schema}}, which the
-- migrator replaces with the quoted schema name.

CREATE TABLE {{schema}}.events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The writing transaction's id. The relay reads by snapshot visibility of
    -- this column, never by id, because ids are assigned before commit and
    -- transactions commit out of id order.
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    index_name  text NOT NULL,
    source_id   text NOT NULL,
    version     bigint NOT NULL,
    op          text NOT NULL,
    document    jsonb,
    event_type  text,
    headers     jsonb,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Fixed 1024 hash buckets of source_id: partitions are bucket ranges, so
    -- every version of one source stays in one partition, in order.
    bucket      smallint GENERATED ALWAYS AS ((hashtext(source_id) & 1023)::smallint) STORED,
    -- Constraint names are the error text a direct INSERT gets: field and reason.
    CONSTRAINT "source_id: must be 1 to 512 bytes" CHECK (octet_length(source_id) BETWEEN 1 AND 512),
    CONSTRAINT "version: must be >= 1" CHECK (version >= 1),
    CONSTRAINT "op: must be upsert or delete" CHECK (op IN ('upsert', 'delete')),
    -- IS NOT NULL: a CHECK that evaluates to NULL passes, so a missing
    -- document must make the expression false, not unknown.
    CONSTRAINT "document: upsert needs a JSON object" CHECK (op <> 'upsert' OR (document IS NOT NULL AND jsonb_typeof(document) = 'object')),
    CONSTRAINT "document: delete must not carry one" CHECK (op <> 'delete' OR document IS NULL),
    CONSTRAINT "headers: must be a JSON object" CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object'),
    CONSTRAINT "index_name: not a valid Elasticsearch index name" CHECK (
        octet_length(index_name) BETWEEN 1 AND 255
        AND index_name NOT IN ('.', '..')
        AND index_name ~ '^[^_+A-Z\\/*?"<>|,# :-][^A-Z\\/*?"<>|,# :]*$'
    )
);

CREATE INDEX events_xid_id ON {{schema}}.events (xid, id);

-- Counter rows for auto-versioning. The row lock taken by the upsert orders
-- concurrent writers of one source: the second waits for the first to commit,
-- so versions increase in commit order.
CREATE TABLE {{schema}}.versions (
    index_name text NOT NULL,
    source_id  text NOT NULL,
    version    bigint NOT NULL,
    PRIMARY KEY (index_name, source_id)
);

-- One row per stream: the acknowledgement boundary. Everything visible in
-- done_snapshot is acknowledged; within the batch up to batch_snapshot,
-- everything at or before (cursor_xid, cursor_id) is acknowledged too.
CREATE TABLE {{schema}}.progress (
    stream         text PRIMARY KEY,
    -- The stream's share of the outbox: a bucket range and optional indexes.
    bucket_lo      smallint NOT NULL DEFAULT 0,
    bucket_hi      smallint NOT NULL DEFAULT 1023,
    indexes        text[],
    done_snapshot  pg_snapshot NOT NULL,
    batch_snapshot pg_snapshot,
    cursor_xid     xid8,
    cursor_id      bigint,
    acked_events   bigint NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.dead_letters (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        bigint NOT NULL,
    stream          text NOT NULL,
    index_name      text NOT NULL,
    source_id       text NOT NULL,
    version         bigint NOT NULL,
    op              text NOT NULL,
    document        jsonb,
    event_type      text,
    headers         jsonb,
    occurred_at     timestamptz NOT NULL,
    reason          text NOT NULL,
    attempts        integer NOT NULL,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    status          text NOT NULL DEFAULT 'parked' CHECK (status IN ('parked', 'retried', 'discarded')),
    resolved_at     timestamptz,
    resolved_by     text
);

CREATE INDEX dead_letters_status ON {{schema}}.dead_letters (status, id);

CREATE TABLE {{schema}}.audit_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    operator text NOT NULL,
    action   text NOT NULL,
    ids      bigint[] NOT NULL DEFAULT '{}',
    detail   jsonb
);

-- Scheduled jobs record their runs here so every replica's page shows them.
CREATE TABLE {{schema}}.job_runs (
    job         text PRIMARY KEY,
    last_start  timestamptz,
    last_end    timestamptz,
    last_error  text,
    runs        bigint NOT NULL DEFAULT 0,
    failures    bigint NOT NULL DEFAULT 0
);
