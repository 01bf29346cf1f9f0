-- A dedupe key travels as the webhook-id header, and the receiver verifies
-- the signature over the key it reads: a key with a leading or trailing
-- blank (receivers trim header values), a control character or a byte
-- outside ASCII (decoded differently by different HTTP stacks) would never
-- verify. append_message refuses them, naming the field and the reason;
-- keys already in the outbox are left as they are.
CREATE OR REPLACE FUNCTION {{schema}}.append_message(destination text, dedupe_key text, payload jsonb) RETURNS bigint
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
    IF dedupe_key !~ '^[ -~]*$' THEN
        RAISE EXCEPTION 'outboxd: dedupe_key: % holds a control character or a non-ASCII character: only printable ASCII travels unchanged in the webhook-id header', quote_literal(dedupe_key) USING ERRCODE = '22023';
    END IF;
    IF dedupe_key <> btrim(dedupe_key, ' ') THEN
        RAISE EXCEPTION 'outboxd: dedupe_key: % starts or ends with a blank, which receivers trim from the webhook-id header (its signature would never verify)', quote_literal(dedupe_key) USING ERRCODE = '22023';
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
