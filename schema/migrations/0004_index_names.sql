-- Index names that outboxd itself derives (N-read, N-write, N-000001) are
-- refused as event index names: events for "x-read" were written through
-- the read alias of "x" into x's documents. Elasticsearch's lowercase rule
-- is Unicode-aware, so "Ünicode" is refused too.
--
-- The Go copy of these rules is outbox.ValidateIndexName
-- (outbox/indexname.go); TestIndexNameRulesAgree checks that both agree.

-- Elasticsearch compares a name with its Locale.ROOT lowercase; ICU's root
-- locale is that mapping. Without ICU, the database's ctype decides (under
-- the plain C locale it lowercases ASCII only).
DO $do$
BEGIN
    EXECUTE 'CREATE FUNCTION {{schema}}.es_lower(name text) RETURNS text IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $f$ SELECT lower(name'
        || CASE WHEN EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu') THEN ' COLLATE "und-x-icu"' ELSE '' END
        || ') $f$';
END
$do$;

-- reserved_suffix returns the suffix of name that outboxd reserves for the
-- names it derives from an index name N (N-read, N-write, N-000001...), or
-- NULL. The Go list is outbox.reservedSuffixes.
CREATE FUNCTION {{schema}}.reserved_suffix(name text) RETURNS text
IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$
    SELECT substring(name FROM '-(?:read|write|[0-9]{6})$')
$$;

-- es_name_problem says why Elasticsearch would refuse name, or the
-- concrete index outboxd derives from it (7 bytes longer), or NULL. These
-- functions stay immutable SQL expressions so that PostgreSQL inlines them
-- into the CHECK constraints: the ::text matters, integer || text is only
-- stable and would turn every checked row into a function call (2-3x the
-- cost of an INSERT into the outbox).
CREATE FUNCTION {{schema}}.es_name_problem(name text) RETURNS text
IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$
    SELECT CASE
        WHEN name IS NULL OR name = '' THEN 'must not be empty'
        WHEN octet_length(name) > 248 THEN octet_length(name)::text
            || ' bytes, at most 248 (Elasticsearch allows 255 and outboxd''s concrete index appends -000001)'
        WHEN name ~ '^[-_+.]' THEN '"' || name || '" must not start with _ - + or .'
        WHEN name ~ '[\\/*?"<>|,#: ]' THEN '"' || name || '" must not contain \ / * ? " < > | , # : or a space'
        WHEN name <> {{schema}}.es_lower(name) THEN '"' || name || '" must be lowercase'
    END
$$;

-- index_name_problem says why name cannot be an event's index_name, or
-- returns NULL: SELECT outbox.index_name_problem('x-read') explains a
-- refused INSERT.
CREATE FUNCTION {{schema}}.index_name_problem(name text) RETURNS text
IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$
    SELECT coalesce({{schema}}.es_name_problem(name),
        '"' || name || '" ends in ' || {{schema}}.reserved_suffix(name)
            || ', which outboxd reserves for the aliases and concrete indexes of index "'
            || left(name, length(name) - length({{schema}}.reserved_suffix(name))) || '"')
$$;

-- NOT VALID: the constraints hold for every new event; events already in
-- the outbox are not rechecked, so the migration never fails on them (the
-- sink's bootstrap refuses such names anyway).
ALTER TABLE {{schema}}.events
    DROP CONSTRAINT "index_name: not a valid Elasticsearch index name",
    ADD CONSTRAINT "index_name: not a valid Elasticsearch index name"
        CHECK ({{schema}}.es_name_problem(index_name) IS NULL) NOT VALID,
    ADD CONSTRAINT "index_name: ends in -read, -write or -NNNNNN (reserved)"
        CHECK ({{schema}}.reserved_suffix(index_name) IS NULL) NOT VALID;

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
    v       bigint := version;
    id      bigint;
    problem text;
BEGIN
    IF source_id IS NULL OR source_id = '' THEN
        RAISE EXCEPTION 'outboxd: source_id: must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(source_id) > 512 THEN
        RAISE EXCEPTION 'outboxd: source_id: % bytes, Elasticsearch allows at most 512', octet_length(source_id) USING ERRCODE = '22023';
    END IF;
    IF version IS NOT NULL AND version < 1 THEN
        RAISE EXCEPTION 'outboxd: version: must be >= 1, got %', version USING ERRCODE = '22023';
    END IF;
    IF op IS NULL OR op NOT IN ('upsert', 'delete') THEN
        RAISE EXCEPTION 'outboxd: op: must be upsert or delete, got %', coalesce(quote_literal(op), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF op = 'upsert' AND (document IS NULL OR jsonb_typeof(document) <> 'object') THEN
        RAISE EXCEPTION 'outboxd: document: an upsert needs a JSON object, got %', coalesce(jsonb_typeof(document), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF op = 'delete' AND document IS NOT NULL THEN
        RAISE EXCEPTION 'outboxd: document: a delete must not carry a document' USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'outboxd: headers: must be a JSON object, got %', jsonb_typeof(headers) USING ERRCODE = '22023';
    END IF;
    problem := {{schema}}.index_name_problem(index_name);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'outboxd: index_name: %', problem USING ERRCODE = '22023';
    END IF;
    IF v IS NULL THEN
        v := {{schema}}.next_version(index_name, source_id);
    END IF;
    INSERT INTO {{schema}}.events (index_name, source_id, version, op, document, event_type, headers)
    VALUES (append.index_name, append.source_id, v, append.op, append.document, append.event_type, append.headers)
    RETURNING events.id INTO id;
    RETURN id;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.capture(tbl regclass, index_name text, id_column text, version_column text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = tbl AND attname = id_column AND NOT attisdropped AND attnum > 0) THEN
        RAISE EXCEPTION 'outboxd: id_column: % has no column %', tbl, quote_ident(id_column) USING ERRCODE = '22023';
    END IF;
    IF version_column IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = tbl AND attname = version_column AND NOT attisdropped AND attnum > 0) THEN
        RAISE EXCEPTION 'outboxd: version_column: % has no column %', tbl, quote_ident(version_column) USING ERRCODE = '22023';
    END IF;
    -- Validates the index name now rather than on the first captured row.
    problem := {{schema}}.index_name_problem(index_name);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'outboxd: index_name: %', problem USING ERRCODE = '22023';
    END IF;
    -- Checked first: DROP TRIGGER IF EXISTS would tell every first capture
    -- that there was nothing to drop.
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = tbl AND tgname = 'outboxd_capture') THEN
        EXECUTE format('DROP TRIGGER outboxd_capture ON %s', tbl);
    END IF;
    -- The schema is an argument, not part of the format string: a % in its
    -- name would otherwise be read as a format specifier.
    EXECUTE format(
        'CREATE TRIGGER outboxd_capture AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s.capture_trigger(%L, %L, %L)',
        tbl, '{{schema}}', index_name, id_column, coalesce(version_column, ''));
END
$$;
