-- Definition-fed indexes: a document is the result of a SQL definition
-- stored here, read by the relay when a refresh event says that a
-- document may have changed (package documents). Everything is added to
-- an existing outbox in place: a new op value, tables, a sequence and
-- functions; no existing row is rewritten or rechecked.

-- A refresh carries no document and no meaningful version (always 1):
-- the relay reads the document and versions that read itself.
-- NOT VALID: existing events all satisfy it; no scan of the outbox.
ALTER TABLE {{schema}}.events
    DROP CONSTRAINT "op: must be upsert or delete",
    ADD CONSTRAINT "op: must be upsert, delete or refresh" CHECK (op IN ('upsert', 'delete', 'refresh')) NOT VALID,
    ADD CONSTRAINT "document: refresh must not carry one" CHECK (op <> 'refresh' OR document IS NULL) NOT VALID;

-- One definition per index. The previous SQL is kept beside the current
-- one, and every change is also an audit_log row (documents.define,
-- documents.drop) with both texts.
CREATE TABLE {{schema}}.documents (
    index_name   text PRIMARY KEY,
    sql          text NOT NULL,
    revision     integer NOT NULL DEFAULT 1,
    defined_by   text NOT NULL,
    defined_at   timestamptz NOT NULL DEFAULT now(),
    previous_sql text,
    previous_by  text,
    previous_at  timestamptz
);

-- Triggers outboxd installed on contributing tables: a changed row
-- refreshes the documents its key names.
CREATE TABLE {{schema}}.document_watches (
    index_name   text NOT NULL REFERENCES {{schema}}.documents (index_name),
    tbl          regclass NOT NULL,
    key          text NOT NULL, -- as given
    key_sql      text NOT NULL, -- the query the trigger runs with $1 the row
    trigger_name text NOT NULL,
    watched_by   text NOT NULL,
    watched_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (index_name, tbl)
);

-- Versions of definition reads (see package documents: a read takes its
-- snapshot and its version under one lock, and the version is at least
-- the clock in microseconds, so it grows across restarts and failovers).
CREATE SEQUENCE {{schema}}.document_reads;

-- refresh appends "the document source_id of index_name may have
-- changed": the relay reads it again from the index's definition. Called
-- inside the business transaction, like append.
CREATE FUNCTION {{schema}}.refresh(index_name text, source_id text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    id bigint;
BEGIN
    IF source_id IS NULL OR source_id = '' THEN
        RAISE EXCEPTION 'outboxd: source_id: must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(source_id) > 512 THEN
        RAISE EXCEPTION 'outboxd: source_id: % bytes, Elasticsearch allows at most 512', octet_length(source_id) USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.documents d WHERE d.index_name = refresh.index_name) THEN
        RAISE EXCEPTION 'outboxd: index_name: % has no document definition, so nothing reads a refresh of it (outboxd documents define --index %)',
            coalesce(quote_literal(index_name), 'NULL'), coalesce(index_name, 'NAME') USING ERRCODE = '22023';
    END IF;
    INSERT INTO {{schema}}.events (index_name, source_id, version, op, event_type)
    VALUES (refresh.index_name, refresh.source_id, 1, 'refresh', 'refresh')
    RETURNING events.id INTO id;
    RETURN id;
END
$$;

-- documents_guard keeps the two kinds of index apart: an upsert or a
-- delete for a definition-fed index (its documents come from the
-- definition), or a refresh of an index without one, fails the writer's
-- transaction. The trigger exists only while some index has a definition
-- (package documents creates it with the first and drops it with the
-- last), so outboxes without definitions pay nothing per event.
CREATE FUNCTION {{schema}}.documents_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    defined boolean := EXISTS (SELECT 1 FROM {{schema}}.documents d WHERE d.index_name = NEW.index_name);
BEGIN
    IF NEW.op = 'refresh' AND NOT defined THEN
        RAISE EXCEPTION 'outboxd: index_name: % has no document definition, so nothing reads a refresh of it', quote_literal(NEW.index_name) USING ERRCODE = '22023';
    END IF;
    IF NEW.op <> 'refresh' AND defined THEN
        RAISE EXCEPTION 'outboxd: op: index % is definition-fed: its documents come from its definition, not from % events; append refresh(index_name, source_id) instead', quote_literal(NEW.index_name), NEW.op USING ERRCODE = '22023';
    END IF;
    RETURN NEW;
END
$$;

-- refresh_watched appends one refresh for a changed row of a table watched
-- with a query key (many documents per row, found through other tables):
-- the relay runs the key query with $1 this row in the snapshot of its
-- read, not here. Run here, it would miss a row that another transaction,
-- not yet committed, is just linking to this one (a tutorial moving to an
-- author being renamed); run in the read's snapshot, which sees this
-- transaction, such a link is either visible or committed later with a
-- refresh of its own, read later still. The row travels as its text form
-- in the headers; the source id only spreads the events over partitions.
CREATE FUNCTION {{schema}}.refresh_watched(index_name text, tbl regclass, row_text text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    id bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.documents d WHERE d.index_name = refresh_watched.index_name) THEN
        RAISE EXCEPTION 'outboxd: index_name: % has no document definition, so nothing reads a refresh of it', quote_literal(index_name) USING ERRCODE = '22023';
    END IF;
    INSERT INTO {{schema}}.events (index_name, source_id, version, op, event_type, headers)
    VALUES (refresh_watched.index_name, 'watch:' || tbl::oid || ':' || md5(row_text), 1, 'refresh', 'refresh.watch',
            jsonb_build_object('outboxd_watch', tbl::oid::bigint, 'row', row_text))
    RETURNING events.id INTO id;
    RETURN id;
END
$$;

-- watch_trigger refreshes, for a changed row, the documents its key
-- names: for the old row and the new one on an UPDATE (a child moved to
-- another parent refreshes both). TG_ARGV[0] is the index, TG_ARGV[1] the
-- key query with $1 the row, TG_ARGV[2] 'row' when the key reads only the
-- row (its ids are refreshed here, each once) or 'query' when it reads
-- other tables (the relay resolves it: see refresh_watched).
CREATE FUNCTION {{schema}}.watch_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    idx  text := TG_ARGV[0];
    q    text := 'SELECT coalesce(array_agg(DISTINCT k::text) FILTER (WHERE k IS NOT NULL), ''{}'') FROM (' || TG_ARGV[1] || ') AS q(k)';
    ids  text[] := '{}';
    more text[];
    sid  text;
BEGIN
    IF TG_ARGV[2] = 'query' THEN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            PERFORM {{schema}}.refresh_watched(idx, TG_RELID::regclass, OLD::text);
        END IF;
        IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW::text IS DISTINCT FROM OLD::text) THEN
            PERFORM {{schema}}.refresh_watched(idx, TG_RELID::regclass, NEW::text);
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        EXECUTE q INTO ids USING OLD;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        EXECUTE q INTO more USING NEW;
        ids := ids || more;
    END IF;
    FOR sid IN SELECT DISTINCT u FROM unnest(ids) AS u LOOP
        PERFORM {{schema}}.refresh(idx, sid);
    END LOOP;
    RETURN NULL;
END
$$;
