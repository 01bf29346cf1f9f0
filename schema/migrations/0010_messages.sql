-- Messages for external destinations (webhooks) travel through the outbox
-- as events on the reserved index names '.outboxd-message.<destination>',
-- so the same engine reads them; Elasticsearch streams exclude the prefix.
-- The delivery ledger and the receivers' inbox live here too.

-- Index names a stream leaves to other streams (entries ending in * are
-- prefixes). NULL on streams registered before it existed.
ALTER TABLE {{schema}}.progress ADD COLUMN exclude text[];

CREATE FUNCTION {{schema}}.append_message(destination text, dedupe_key text, payload jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    id bigint;
BEGIN
    IF destination IS NULL OR destination !~ '^[a-z0-9][a-z0-9_-]{0,62}$' THEN
        RAISE EXCEPTION 'outboxd: destination: % is not a valid destination name (1 to 63 of a-z 0-9 _ -, starting with a letter or digit)', coalesce(quote_literal(destination), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF dedupe_key IS NULL OR dedupe_key = '' THEN
        RAISE EXCEPTION 'outboxd: dedupe_key: must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(dedupe_key) > 512 THEN
        RAISE EXCEPTION 'outboxd: dedupe_key: % bytes, at most 512', octet_length(dedupe_key) USING ERRCODE = '22023';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'outboxd: payload: must be a JSON object, got %', coalesce(jsonb_typeof(payload), 'NULL') USING ERRCODE = '22023';
    END IF;
    -- Version 1 always: the ledger, not a version, decides that a key is
    -- sent once, and no counter row is kept per message.
    INSERT INTO {{schema}}.events (index_name, source_id, version, op, document, event_type)
    VALUES ('.outboxd-message.' || destination, dedupe_key, 1, 'upsert', payload, 'message')
    RETURNING events.id INTO id;
    RETURN id;
END
$$;

-- The delivery ledger: one row per (destination, dedupe key). The primary
-- key is the reservation: the first message with a key inserts the row,
-- every later one finds it and is recorded as a duplicate, never sent.
CREATE TABLE {{schema}}.deliveries (
    destination  text NOT NULL,
    dedupe_key   text NOT NULL,
    event_id     bigint NOT NULL, -- the message that holds the reservation
    payload      jsonb NOT NULL,
    state        text NOT NULL DEFAULT 'reserved'
                 CHECK (state IN ('reserved', 'delivered', 'failed', 'skipped', 'unknown')),
    attempts     integer NOT NULL DEFAULT 0,
    -- An attempt was claimed and its answer never recorded: the relay
    -- stopped (or lost its stream) while the request may have been sent.
    in_flight    boolean NOT NULL DEFAULT false,
    -- Some attempt may have reached the receiver without an answer.
    uncertain    boolean NOT NULL DEFAULT false,
    last_status  integer,
    last_error   text,
    duplicates   bigint[] NOT NULL DEFAULT '{}', -- event ids of later messages with this key
    reserved_at  timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    resolved_by  text,
    PRIMARY KEY (destination, dedupe_key)
);

CREATE INDEX deliveries_state ON {{schema}}.deliveries (state, destination);

-- The inbox of a receiving service: one row per upstream message key,
-- inserted in the receiver's own transaction so the side effect and the
-- dedupe commit (or roll back) together.
CREATE TABLE {{schema}}.inbox (
    source      text NOT NULL,
    key         text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, key),
    CONSTRAINT "source: must be 1 to 255 bytes" CHECK (octet_length(source) BETWEEN 1 AND 255),
    CONSTRAINT "key: must be 1 to 512 bytes" CHECK (octet_length(key) BETWEEN 1 AND 512)
);

-- inbox_receive is true for the first delivery of (source, key) and false
-- for every repeat. A concurrent first delivery waits on the unique key
-- and gets false once the other commits (true if it rolls back).
CREATE FUNCTION {{schema}}.inbox_receive(source text, key text) RETURNS boolean
LANGUAGE sql AS $$
    WITH ins AS (
        INSERT INTO {{schema}}.inbox (source, key) VALUES (inbox_receive.source, inbox_receive.key)
        ON CONFLICT DO NOTHING RETURNING true
    )
    SELECT coalesce((SELECT true FROM ins), false)
$$;
