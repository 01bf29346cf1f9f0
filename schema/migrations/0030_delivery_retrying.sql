-- A webhook message whose receiver asks it to come back later (429,
-- 408, a connection refused, a 5xx under retry_5xx or idempotent=true)
-- retries in line only within its destination's retry_inline budget;
-- after that it is parked as 'retrying' until next_attempt_at, and the
-- relay acknowledges its event: the row, payload and attempt count
-- included, now owns the message, and the destination's leader retries it
-- from there, so one failing message never holds back the others. The
-- state is added to whatever the state CHECK allows by now, so other
-- states added to it are kept.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
             WHERE conrelid = '{{schema}}.deliveries'::regclass AND contype = 'c'
               AND pg_get_constraintdef(oid) LIKE '%state%' AND pg_get_constraintdef(oid) NOT LIKE '%''retrying''%'
    LOOP
        -- Concatenated, not format(): the schema's name may hold a %.
        EXECUTE 'ALTER TABLE {{schema}}.deliveries DROP CONSTRAINT ' || quote_ident(c.conname);
        EXECUTE 'ALTER TABLE {{schema}}.deliveries ADD CONSTRAINT ' || quote_ident(c.conname) || ' '
                || replace(c.def, 'ARRAY[', 'ARRAY[''retrying''::text, ');
    END LOOP;
END
$$;

-- When a retrying message is due, by the database's clock (relays on
-- several hosts agree on it). NULL in every other state.
ALTER TABLE {{schema}}.deliveries ADD COLUMN next_attempt_at timestamptz;

-- The destination's leader looks for its due messages at least once a
-- second: an index of the parked rows alone keeps that cheap however
-- large the ledger.
CREATE INDEX deliveries_due ON {{schema}}.deliveries (destination, next_attempt_at)
    WHERE state = 'retrying';
