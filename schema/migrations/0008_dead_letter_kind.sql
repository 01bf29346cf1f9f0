-- Why an event was parked, as data rather than a phrase in its reason:
-- 'rejected' (the sink will never accept it as it is) or 'gave_up' (it
-- failed transiently past the attempt limit; worth retrying by schedule).
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN kind text NOT NULL DEFAULT 'rejected'
        CONSTRAINT "kind: must be rejected or gave_up" CHECK (kind IN ('rejected', 'gave_up'));

UPDATE {{schema}}.dead_letters SET kind = 'gave_up' WHERE reason LIKE 'gave up after %';
