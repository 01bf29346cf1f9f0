-- The example service's own tables. Every statement is idempotent (IF NOT
-- EXISTS) and written against {{schema}}, replaced with the quoted schema name.

CREATE TABLE IF NOT EXISTS {{schema}}.tutorials (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    author_id  text NOT NULL,
    -- The business idempotency key: the Idempotency-Key header unless the
    -- client sends its own request_id. The unique constraint below is the
    -- last line of defence against a second row for one submission.
    request_id text NOT NULL,
    title      text NOT NULL,
    body       text NOT NULL DEFAULT '',
    tags       text[] NOT NULL DEFAULT '{}',
    -- Bumped by every write in the same statement; the outbox event carries
    -- it, so the index applies writes in this order whatever the delivery order.
    version    bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    deleted_at timestamptz,
    CONSTRAINT tutorials_author_request UNIQUE (author_id, request_id)
);

CREATE TABLE IF NOT EXISTS {{schema}}.idempotency_keys (
    user_id         text NOT NULL,
    key             text NOT NULL,
    method          text NOT NULL,
    path            text NOT NULL,
    -- hex SHA-256 of method, path and the normalized JSON payload
    request_hash    text NOT NULL,
    status          text NOT NULL CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAILED')),
    -- The owner of a PROCESSING claim and its lease. A claim whose lease ran
    -- out belongs to a crashed request and may be taken over; the token
    -- fences the old owner out of completing it afterwards.
    lock_token      uuid,
    locked_until    timestamptz,
    response_status integer,
    response_body   bytea,
    resource_id     text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (user_id, key)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON {{schema}}.idempotency_keys (expires_at);

-- Notifications received on POST /api/webhooks/{source}: the side effect of
-- a webhook, written in the same transaction as its inbox record.
CREATE TABLE IF NOT EXISTS {{schema}}.notifications (
    source      text NOT NULL,
    key         text NOT NULL,
    payload     jsonb NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
