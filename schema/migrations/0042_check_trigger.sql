-- The rules an event must meet move from CHECK constraints into one BEFORE
-- row trigger, and append stops checking them a second time. Measured with
-- server CPU per single-row INSERT (docs/benchmarks.md, "pgbench"): the
-- CHECKs cost 80 µs of a 116 µs INSERT, a minimal outbox INSERT 24 µs.
-- PostgreSQL plans every CHECK expression again at the start of every
-- statement (inlining the SQL functions es_name_problem and reserved_suffix
-- means parsing their bodies each time), so a one-row INSERT paid for
-- planning eleven expressions; a PL/pgSQL trigger plans its expressions
-- once per session and only evaluates them per row. The auto-version
-- counter moves into append's PL/pgSQL body: its upsert was a SQL function
-- (next_version) that PostgreSQL parsed and planned again in every
-- transaction, and inline it is a cached plan. It stays append's first
-- write, before the INSERT, and not in the trigger: the transaction's xid
-- must be taken under the counter row's lock, or two writers of one source
-- could get xids in one order and versions in the other, and the relay
-- (which reads in (xid, id) order) would deliver a source's versions out
-- of commit order. An INSERT evaluates its column defaults before BEFORE
-- triggers run, and the id's identity sequence assigns the transaction an
-- xid whenever it logs a new range of values (every 32), so a counter
-- taken in the trigger is too late.
--
-- Every guarantee stays: every path into the outbox (append, the capture
-- trigger, append_message, refresh, a direct INSERT, COPY) meets the same
-- rules, and a refused event fails the statement, and so the caller's
-- transaction, with SQLSTATE 22023 and "outboxd: <field>: <reason>". The
-- trigger is ENABLE ALWAYS, so session_replication_role = replica (logical
-- replication's apply, pg_restore --disable-triggers aside) does not skip
-- it; only ALTER TABLE ... DISABLE TRIGGER, like dropping a CHECK, does.
-- Upgrading a live outbox: nothing is rewritten or scanned. The migration
-- takes an ACCESS EXCLUSIVE lock on events (DROP CONSTRAINT needs it) for
-- the few milliseconds of the catalog changes, and gives up after
-- lock_timeout 5s rather than queue every writer behind a long transaction
-- that holds the table: run `outboxd migrate` again then. Events already in
-- the outbox were written under the CHECKs (or, for the NOT VALID ones,
-- are refused by the sink), so dropping them loses nothing.

SELECT set_config('outboxd.lock_timeout', current_setting('lock_timeout'), true),
       set_config('lock_timeout', '5s', true);
LOCK TABLE {{schema}}.events IN ACCESS EXCLUSIVE MODE;

-- check_event raises, for the first rule the row breaks, what append
-- raised before (the same order: source_id, version, op, document,
-- headers, index_name). A NULL version is NOT NULL's to refuse: only
-- append hands out automatic versions (see above).
CREATE FUNCTION {{schema}}.check_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    IF NEW.source_id IS NULL OR NEW.source_id = '' THEN
        RAISE EXCEPTION 'outboxd: source_id: must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(NEW.source_id) > 512 THEN
        RAISE EXCEPTION 'outboxd: source_id: % bytes, Elasticsearch allows at most 512', octet_length(NEW.source_id) USING ERRCODE = '22023';
    END IF;
    IF NEW.version < 1 THEN
        RAISE EXCEPTION 'outboxd: version: must be >= 1, got %', NEW.version USING ERRCODE = '22023';
    END IF;
    IF NEW.op IS NULL OR NEW.op NOT IN ('upsert', 'delete', 'refresh') THEN
        RAISE EXCEPTION 'outboxd: op: must be upsert, delete or refresh, got %', coalesce(quote_literal(NEW.op), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF NEW.op = 'upsert' THEN
        IF NEW.document IS NULL OR jsonb_typeof(NEW.document) <> 'object' THEN
            RAISE EXCEPTION 'outboxd: document: an upsert needs a JSON object, got %', coalesce(jsonb_typeof(NEW.document), 'NULL') USING ERRCODE = '22023';
        END IF;
        IF NEW.document ?| ARRAY['outboxd_deleted', 'outboxd_deleted_at'] THEN
            RAISE EXCEPTION 'outboxd: document: the top-level field % is reserved (it marks a delete''s tombstone in the index)',
                CASE WHEN NEW.document ? 'outboxd_deleted' THEN 'outboxd_deleted' ELSE 'outboxd_deleted_at' END USING ERRCODE = '22023';
        END IF;
    ELSIF NEW.document IS NOT NULL AND NEW.op = 'delete' THEN
        RAISE EXCEPTION 'outboxd: document: a delete must not carry a document' USING ERRCODE = '22023';
    ELSIF NEW.document IS NOT NULL THEN
        RAISE EXCEPTION 'outboxd: document: % must not carry one', NEW.op USING ERRCODE = '22023';
    END IF;
    IF NEW.headers IS NOT NULL AND jsonb_typeof(NEW.headers) <> 'object' THEN
        RAISE EXCEPTION 'outboxd: headers: must be a JSON object, got %', jsonb_typeof(NEW.headers) USING ERRCODE = '22023';
    END IF;
    IF NEW.index_name LIKE '.outboxd-message.%' THEN
        -- The message namespace: only append_message's upsert under a
        -- valid destination name (the dedupe key is the source_id above).
        IF NEW.op <> 'upsert' OR substr(NEW.index_name, 18) !~ '^[a-z0-9][a-z0-9_-]{0,62}$' THEN
            RAISE EXCEPTION 'outboxd: message: only append_message''s upsert of a JSON object with a valid destination and dedupe key, got % of %', NEW.op, quote_literal(NEW.index_name) USING ERRCODE = '22023';
        END IF;
    ELSE
        -- One regular expression and a lowercase comparison for the
        -- common, valid name; the full explanation only for a bad one.
        IF NEW.index_name IS NULL OR octet_length(NEW.index_name) NOT BETWEEN 1 AND 248
           OR NEW.index_name ~ '^[-_+.]|[\\/*?"<>|,#: ]|-(read|write|[0-9]{6})$'
           OR NEW.index_name <> {{schema}}.es_lower(NEW.index_name) THEN
            problem := {{schema}}.index_name_problem(NEW.index_name);
            IF problem IS NOT NULL THEN
                RAISE EXCEPTION 'outboxd: index_name: %', problem USING ERRCODE = '22023';
            END IF;
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- Named to run before outboxd_documents_guard (BEFORE triggers run in name
-- order), so a malformed event is explained before it is classified. Unlike
-- a CHECK, it sees the row as it is when it runs: an application's own
-- BEFORE trigger on the outbox table whose name sorts after outboxd_check
-- could change the row after it was checked (the sink still refuses what
-- Elasticsearch cannot take). COPY inserts row by row on a table with a
-- BEFORE ROW trigger, so AppendBatch's explicit versions lose COPY's
-- multi-row inserts; they still save the round trips. In the message
-- namespace the destination's own rule applies, not the index names'
-- reserved suffixes (a destination is not an index: "orders-read" is a
-- valid destination, which a CHECK of 0004 used to refuse).
CREATE TRIGGER outboxd_check BEFORE INSERT OR UPDATE ON {{schema}}.events
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.check_event();
ALTER TABLE {{schema}}.events ENABLE ALWAYS TRIGGER outboxd_check;


ALTER TABLE {{schema}}.events
    DROP CONSTRAINT IF EXISTS "source_id: must be 1 to 512 bytes",
    DROP CONSTRAINT IF EXISTS "version: must be >= 1",
    DROP CONSTRAINT IF EXISTS "op: must be upsert, delete or refresh",
    DROP CONSTRAINT IF EXISTS "document: upsert needs a JSON object",
    DROP CONSTRAINT IF EXISTS "document: delete must not carry one",
    DROP CONSTRAINT IF EXISTS "document: refresh must not carry one",
    DROP CONSTRAINT IF EXISTS "document: outboxd_deleted, outboxd_deleted_at are reserved",
    DROP CONSTRAINT IF EXISTS "headers: must be a JSON object",
    DROP CONSTRAINT IF EXISTS "index_name: not a valid Elasticsearch index name",
    DROP CONSTRAINT IF EXISTS "index_name: ends in -read, -write or -NNNNNN (reserved)",
    DROP CONSTRAINT IF EXISTS "message: only append_message's upsert of a JSON object with a v";

-- append: the trigger validates; what is left here are the rules of
-- append itself (the message namespace belongs to append_message, and a
-- refresh to refresh()) and the automatic version, taken first (see
-- above). A refused event rolls its counter increment back with the
-- statement. The parameters stay as they were (callers name them).
CREATE OR REPLACE FUNCTION {{schema}}.append(
    index_name text,
    source_id  text,
    version    bigint,
    op         text,
    document   jsonb,
    event_type text DEFAULT NULL,
    headers    jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    id bigint;
    v  bigint := append.version;
BEGIN
    IF append.index_name LIKE '.outboxd-message.%' THEN
        RAISE EXCEPTION 'outboxd: index_name: %', {{schema}}.index_name_problem(append.index_name) USING ERRCODE = '22023';
    END IF;
    IF append.op IS NULL OR append.op NOT IN ('upsert', 'delete') THEN
        RAISE EXCEPTION 'outboxd: op: must be upsert or delete, got %', coalesce(quote_literal(append.op), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF v IS NULL AND octet_length(append.source_id) BETWEEN 1 AND 512
       AND octet_length(append.index_name) BETWEEN 1 AND 248 THEN
        -- The counter row's lock is held until commit: a second writer of
        -- the source waits here and then gets the next number, so versions
        -- increase in commit order. (A source_id or index_name the trigger
        -- refuses takes no counter: the INSERT below fails with its reason,
        -- not with the counter table's NOT NULL or index row size.)
        INSERT INTO {{schema}}.versions AS c (index_name, source_id, version)
        VALUES (append.index_name, append.source_id, 1)
        ON CONFLICT ON CONSTRAINT versions_pkey DO UPDATE SET version = c.version + 1
        RETURNING c.version INTO v;
    END IF;
    INSERT INTO {{schema}}.events (index_name, source_id, version, op, document, event_type, headers)
    VALUES (append.index_name, append.source_id, v, append.op, append.document, append.event_type, append.headers)
    RETURNING events.id INTO id;
    RETURN id;
END
$$;

SELECT set_config('lock_timeout', current_setting('outboxd.lock_timeout'), true);
