-- State of `outboxd rebuild`: one row per index name, the latest rebuild.
-- checkpoints holds, per shard of old_index, the sequence number up to
-- which its documents are known to be in new_index; a rebuild killed at
-- any point continues from this row.
CREATE TABLE {{schema}}.rebuilds (
    index_name       text PRIMARY KEY,
    old_index        text NOT NULL,
    new_index        text NOT NULL,
    phase            text NOT NULL CHECK (phase IN ('copying', 'catching_up', 'swapped', 'done', 'aborted')),
    options_hash     text NOT NULL,
    checkpoints      jsonb NOT NULL,
    copied           bigint NOT NULL DEFAULT 0,
    total            bigint NOT NULL DEFAULT 0,
    rejected         bigint NOT NULL DEFAULT 0,
    rejected_samples jsonb NOT NULL DEFAULT '[]',
    keep_until       timestamptz,
    started_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    swapped_at       timestamptz,
    finished_at      timestamptz,
    old_dropped_at   timestamptz
);
