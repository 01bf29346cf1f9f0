-- A message for a destination that no live relay serves waits in the
-- ledger as 'waiting' (it is never failed for that): it is delivered once
-- a relay with the destination starts. The state is added to whatever the
-- state CHECK allows by now, so other states added to it are kept.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
             WHERE conrelid = '{{schema}}.deliveries'::regclass AND contype = 'c'
               AND pg_get_constraintdef(oid) LIKE '%state%' AND pg_get_constraintdef(oid) NOT LIKE '%''waiting''%'
    LOOP
        -- Concatenated, not format(): the schema's name may hold a %.
        EXECUTE 'ALTER TABLE {{schema}}.deliveries DROP CONSTRAINT ' || quote_ident(c.conname);
        EXECUTE 'ALTER TABLE {{schema}}.deliveries ADD CONSTRAINT ' || quote_ident(c.conname) || ' '
                || replace(c.def, 'ARRAY[', 'ARRAY[''waiting''::text, ');
    END LOOP;
END
$$;

-- One row per relay process, written before it joins the relays (the
-- shared advisory lock): the streams it can lead. A row counts only while
-- its backend pid holds that lock, so rows of relays that are gone are
-- ignored (and removed by the next relay that joins). The balancer hands a
-- stream only to a relay that can lead it.
CREATE TABLE {{schema}}.relays (
    pid        integer PRIMARY KEY, -- backend pid of the relay's membership session
    streams    text[] NOT NULL,
    client     text NOT NULL DEFAULT '',
    joined_at  timestamptz NOT NULL DEFAULT now()
);
