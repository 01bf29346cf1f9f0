-- An UPDATE that changes a captured row's id column moves the document: the
-- old id gets a delete, at one above the old row's version (the delete
-- rule: it beats every upsert the old id had), and the new id an upsert.
-- Before, only the upsert was written and the old id's document stayed in
-- the index forever.
--
-- A re-used id is not special-cased: with a version column, a row inserted
-- again under a deleted id whose version restarts at 1 stays hidden behind
-- the old id's tombstone until its version passes the tombstone's; without
-- a version column the outbox counter keeps counting across the delete,
-- so the new row is visible at once (docs/writing-events.md).
CREATE OR REPLACE FUNCTION {{schema}}.capture_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    idx      text := TG_ARGV[0];
    id_col   text := TG_ARGV[1];
    ver_col  text := nullif(TG_ARGV[2], '');
    r        jsonb;
    sid      text;
    ver      bigint;
    old_r    jsonb;
    old_sid  text;
    old_ver  bigint;
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
    IF TG_OP = 'UPDATE' THEN
        old_r := to_jsonb(OLD);
        old_sid := old_r ->> id_col;
        -- A row without an id never had a document to delete.
        IF old_sid IS NOT NULL AND old_sid IS DISTINCT FROM sid THEN
            IF ver_col IS NOT NULL THEN
                old_ver := (old_r ->> ver_col)::bigint;
            END IF;
            PERFORM {{schema}}.append(idx, old_sid, old_ver + 1, 'delete', NULL, TG_TABLE_NAME || '.deleted');
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        PERFORM {{schema}}.append(idx, sid, ver + 1, 'delete', NULL, TG_TABLE_NAME || '.deleted');
    ELSE
        PERFORM {{schema}}.append(idx, sid, ver, 'upsert', r, TG_TABLE_NAME || CASE TG_OP WHEN 'INSERT' THEN '.inserted' ELSE '.updated' END);
    END IF;
    RETURN NULL;
END
$$;
