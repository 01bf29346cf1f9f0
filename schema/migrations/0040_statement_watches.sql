-- Watches become statement-level triggers with transition tables: a
-- statement that changes N watched rows runs the key once over all of
-- them and appends its refreshes with one INSERT ... SELECT, instead of
-- N trigger calls that each EXECUTE the key and call refresh() (measured:
-- ~470 us per row, a 100k-row UPDATE took 46.6 s to commit). PostgreSQL
-- allows transition tables only on a trigger of one event, so a watch is
-- three triggers: <name> (UPDATE), <name>_insert and <name>_delete.
--
-- In place: the function is replaced and every watch in document_watches
-- gets its three triggers. On a plain table <name> is replaced with
-- CREATE OR REPLACE TRIGGER, which takes SHARE ROW EXCLUSIVE on the table
-- (writes to it wait for the migration's transaction, reads do not). On a
-- partitioned table the row trigger is dropped first (ACCESS EXCLUSIVE on
-- the table and its partitions): replacing it would leave its clones on
-- the partitions firing per row.

-- watch_key_rows turns a row key (a query with $1 the row) into one that
-- reads the row from outboxd_rows.outboxd_row, so that it runs once over a
-- whole transition table. $1 inside a quoted string or identifier is left
-- alone; $10 and above are not $1.
CREATE FUNCTION {{schema}}.watch_key_rows(key_sql text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    out text := '';
    tok text;
BEGIN
    FOR tok IN SELECT m[1] FROM regexp_matches(key_sql, '(''(?:[^'']|'''')*''|"(?:[^"]|"")*"|\$1(?![0-9])|[^''"$]+|.)', 'g') AS m LOOP
        out := out || CASE WHEN tok = '$1' THEN '(outboxd_rows.outboxd_row)' ELSE tok END;
    END LOOP;
    RETURN out;
END
$$;

-- watch_statement is the SQL text watch_trigger EXECUTEs for a statement
-- of event op on tbl: for a 'query' key the distinct rows' texts, for a
-- 'row' key the distinct non-NULL ids its rewritten key returns, as one
-- text[]. old_rows and new_rows name the rows: the transition tables in
-- the trigger, an empty set of tbl's rows in watch_check. One function
-- builds both, so the check runs exactly what the trigger will.
CREATE FUNCTION {{schema}}.watch_statement(tbl regclass, op text, key_sql text, mode text, old_rows text, new_rows text) RETURNS text
-- STABLE: the table's name is as the search_path spells it.
LANGUAGE plpgsql STABLE AS $$
DECLARE
    -- The transition tables' rows are records: cast to the table's type,
    -- which the key was checked against.
    src text := CASE op
        WHEN 'INSERT' THEN format('SELECT o::%s AS outboxd_row FROM %s o', tbl, new_rows)
        WHEN 'DELETE' THEN format('SELECT o::%s AS outboxd_row FROM %s o', tbl, old_rows)
        ELSE format('SELECT o::%1$s AS outboxd_row FROM %2$s o UNION ALL SELECT o::%1$s FROM %3$s o', tbl, old_rows, new_rows) END;
BEGIN
    IF mode = 'query' THEN
        RETURN 'SELECT array_agg(DISTINCT outboxd_row::text) FROM (' || src || ') AS outboxd_rows';
    END IF;
    RETURN 'SELECT array_agg(DISTINCT q.k::text) FROM (' || src || ') AS outboxd_rows, LATERAL ('
        || {{schema}}.watch_key_rows(key_sql) || ') AS q(k) WHERE q.k IS NOT NULL';
END
$$;

-- watch_check runs, for each event, the statement watch_trigger would
-- EXECUTE over an empty set of tbl's rows, so that a key the $1 rewrite
-- breaks fails when it is watched, not at the first write to tbl.
-- Package documents calls it before watch_install, in its transaction.
CREATE FUNCTION {{schema}}.watch_check(tbl regclass, key_sql text, mode text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    none text := format('(SELECT (NULL::%s).* LIMIT 0)', tbl);
    op   text;
    vals text[];
BEGIN
    FOREACH op IN ARRAY ARRAY['INSERT', 'UPDATE', 'DELETE'] LOOP
        EXECUTE {{schema}}.watch_statement(tbl, op, key_sql, mode, none, none) INTO vals;
    END LOOP;
END
$$;

-- watch_trigger refreshes, for the rows a statement changed, the
-- documents their key names: for the old rows and the new ones of an
-- UPDATE (a child moved to another parent refreshes both). TG_ARGV[0] is
-- the index, TG_ARGV[1] the key query with $1 the row, TG_ARGV[2] 'row'
-- when the key reads only the row (its ids are refreshed here, each once
-- per statement, checked as refresh() checks them) or 'query' when it
-- reads other tables (the relay resolves each row: see refresh_watched;
-- each distinct row text once per statement, so a row an UPDATE left
-- unchanged is recorded once, as its old row, as the row trigger did).
-- The transition tables are outboxd_old and outboxd_new.
CREATE OR REPLACE FUNCTION {{schema}}.watch_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    idx  text := TG_ARGV[0];
    stmt text := {{schema}}.watch_statement(TG_RELID::regclass, TG_OP, TG_ARGV[1], TG_ARGV[2], 'outboxd_old', 'outboxd_new');
    vals text[];
    bad  text;
BEGIN
    IF TG_ARGV[2] = 'query' THEN
        EXECUTE stmt INTO vals;
        IF vals IS NULL THEN
            RETURN NULL;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM {{schema}}.documents d WHERE d.index_name = idx) THEN
            RAISE EXCEPTION 'outboxd: index_name: % has no document definition, so nothing reads a refresh of it', quote_literal(idx) USING ERRCODE = '22023';
        END IF;
        INSERT INTO {{schema}}.events (index_name, source_id, version, op, event_type, headers)
        SELECT idx, 'watch:' || TG_RELID || ':' || md5(r), 1, 'refresh', 'refresh.watch',
               jsonb_build_object('outboxd_watch', TG_RELID::bigint, 'row', r)
        FROM unnest(vals) AS r;
        RETURN NULL;
    END IF;
    EXECUTE stmt INTO vals;
    IF vals IS NULL THEN
        RETURN NULL;
    END IF;
    -- refresh()'s checks, over the whole set, with its texts.
    IF '' = ANY (vals) THEN
        RAISE EXCEPTION 'outboxd: source_id: must not be empty' USING ERRCODE = '22023';
    END IF;
    SELECT u INTO bad FROM unnest(vals) AS u WHERE octet_length(u) > 512 LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'outboxd: source_id: % bytes, Elasticsearch allows at most 512', octet_length(bad) USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.documents d WHERE d.index_name = idx) THEN
        RAISE EXCEPTION 'outboxd: index_name: % has no document definition, so nothing reads a refresh of it (outboxd documents define --index %)',
            coalesce(quote_literal(idx), 'NULL'), coalesce(idx, 'NAME') USING ERRCODE = '22023';
    END IF;
    INSERT INTO {{schema}}.events (index_name, source_id, version, op, event_type)
    SELECT idx, u, 1, 'refresh', 'refresh' FROM unnest(vals) AS u;
    RETURN NULL;
END
$$;

-- watch_install creates (or replaces) a watch's three triggers on tbl.
-- Package documents calls it for every watch it installs.
CREATE FUNCTION {{schema}}.watch_install(tbl regclass, trigger_name text, index_name text, key_sql text, mode text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    fn text := format('%s.watch_trigger(%L, %L, %L)', '{{schema}}', index_name, key_sql, mode);
BEGIN
    IF mode NOT IN ('row', 'query') THEN
        RAISE EXCEPTION 'outboxd: mode: % is neither row nor query', quote_literal(mode) USING ERRCODE = '22023';
    END IF;
    -- A row trigger's clones on partitions would survive a replace.
    IF EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
               WHERE t.tgrelid = tbl AND t.tgname = watch_install.trigger_name AND t.tgtype & 1 = 1 AND c.relkind = 'p') THEN
        EXECUTE format('DROP TRIGGER %I ON %s', trigger_name, tbl);
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS outboxd_old NEW TABLE AS outboxd_new FOR EACH STATEMENT EXECUTE FUNCTION %s',
        trigger_name, tbl, fn);
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS outboxd_new FOR EACH STATEMENT EXECUTE FUNCTION %s',
        trigger_name || '_insert', tbl, fn);
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS outboxd_old FOR EACH STATEMENT EXECUTE FUNCTION %s',
        trigger_name || '_delete', tbl, fn);
END
$$;

-- Every existing watch, in place. The mode is the key's form as package
-- documents reads it (a key starting with SELECT or WITH is a query key);
-- a watch whose table is gone is left as it is.
SELECT {{schema}}.watch_install(w.tbl, w.trigger_name, w.index_name, w.key_sql,
       CASE WHEN w.key ~* '^\s*(select|with)\M' THEN 'query' ELSE 'row' END)
FROM {{schema}}.document_watches w
WHERE EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = w.tbl)
ORDER BY w.tbl, w.index_name;
