-- Later messages with the same key but a different payload: they are not
-- sent (the key is the reservation) but are reported as conflicts, since
-- the application meant something else by them.
ALTER TABLE {{schema}}.deliveries ADD COLUMN conflicts bigint[] NOT NULL DEFAULT '{}';

-- The message namespace holds only what append_message writes: an upsert
-- of a JSON object under a valid destination name and a dedupe key of 1
-- to 512 bytes. Anything else could never be delivered. NOT VALID: rows
-- already there are left to the sink, which dead-letters them.
ALTER TABLE {{schema}}.events
    ADD CONSTRAINT "message: only append_message's upsert of a JSON object with a valid destination and dedupe key"
        CHECK (index_name NOT LIKE '.outboxd-message.%' OR (
            op = 'upsert'
            AND jsonb_typeof(document) = 'object'
            AND octet_length(source_id) BETWEEN 1 AND 512
            AND substr(index_name, 18) ~ '^[a-z0-9][a-z0-9_-]{0,62}$')) NOT VALID;
