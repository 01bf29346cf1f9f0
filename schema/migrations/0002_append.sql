-- The SQL API: callable inside any application's own transaction.

CREATE FUNCTION {{schema}}.next_version(p_index text, p_source text) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO {{schema}}.versions AS v (index_name, source_id, version)
    VALUES (p_index, p_source, 1)
    ON CONFLICT (index_name, source_id) DO UPDATE SET version = v.version + 1
    RETURNING v.version
$$;

-- append validates before writing so a bad call fails the caller's
-- transaction with the field and the reason, and nothing is half-written.
-- A NULL version asks the outbox to assign the next one for the source.
CREATE FUNCTION {{schema}}.append(
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
    v  bigint := version;
    id bigint;
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
    IF index_name IS NULL OR index_name = '' THEN
        RAISE EXCEPTION 'outboxd: index_name: must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(index_name) > 255 THEN
        RAISE EXCEPTION 'outboxd: index_name: % bytes, Elasticsearch allows at most 255', octet_length(index_name) USING ERRCODE = '22023';
    END IF;
    IF index_name IN ('.', '..') OR index_name !~ '^[^_+A-Z\\/*?"<>|,# :-][^A-Z\\/*?"<>|,# :]*$' THEN
        RAISE EXCEPTION 'outboxd: index_name: % is not a valid Elasticsearch index name (lowercase; no \ / * ? " < > | , # : or space; must not start with _ - +)', quote_literal(index_name) USING ERRCODE = '22023';
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

-- Zero-code capture: a row trigger appends one event per changed row. No
-- NOTIFY here: NOTIFY takes a cluster-wide lock at commit and would
-- serialize every writer of the captured table.
CREATE FUNCTION {{schema}}.capture_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    idx      text := TG_ARGV[0];
    id_col   text := TG_ARGV[1];
    ver_col  text := nullif(TG_ARGV[2], '');
    r        jsonb;
    sid      text;
    ver      bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := to_jsonb(OLD);
    ELSE
        r := to_jsonb(NEW);
    END IF;
    sid := r ->> id_col;
    IF ver_col IS NOT NULL THEN
        ver := (r ->> ver_col)::bigint;
    END IF;
    IF TG_OP = 'DELETE' THEN
        PERFORM {{schema}}.append(idx, sid, CASE WHEN ver IS NULL THEN NULL ELSE ver + 1 END, 'delete', NULL, TG_TABLE_NAME || '.deleted');
    ELSE
        PERFORM {{schema}}.append(idx, sid, ver, 'upsert', r, TG_TABLE_NAME || CASE TG_OP WHEN 'INSERT' THEN '.inserted' ELSE '.updated' END);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION {{schema}}.capture(tbl regclass, index_name text, id_column text, version_column text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = tbl AND attname = id_column AND NOT attisdropped AND attnum > 0) THEN
        RAISE EXCEPTION 'outboxd: id_column: % has no column %', tbl, quote_ident(id_column) USING ERRCODE = '22023';
    END IF;
    IF version_column IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = tbl AND attname = version_column AND NOT attisdropped AND attnum > 0) THEN
        RAISE EXCEPTION 'outboxd: version_column: % has no column %', tbl, quote_ident(version_column) USING ERRCODE = '22023';
    END IF;
    -- Validates the index name now rather than on the first captured row.
    PERFORM 1 WHERE index_name ~ '^[^_+A-Z\\/*?"<>|,# :-][^A-Z\\/*?"<>|,# :]*$' AND octet_length(index_name) <= 255
        AND index_name NOT IN ('.', '..');
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outboxd: index_name: % is not a valid Elasticsearch index name', quote_literal(index_name) USING ERRCODE = '22023';
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

CREATE FUNCTION {{schema}}.uncapture(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS outboxd_capture ON %s', tbl);
END
$$;

-- refuse fails the calling statement, and so the caller's transaction, with
-- reason. The Go Append validates in the client and calls it on a refusal,
-- so a bad event aborts the transaction exactly as the SQL append does.
CREATE FUNCTION {{schema}}.refuse(reason text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', reason USING ERRCODE = '22023';
END
$$;
