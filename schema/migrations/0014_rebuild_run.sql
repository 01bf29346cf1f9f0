-- The run of `outboxd rebuild` that owns a rebuild: every state write is
-- conditional on it, so a run that lost its lock (its session ended) and
-- was taken over stops instead of writing beside the new owner.
ALTER TABLE {{schema}}.rebuilds ADD COLUMN run_id text;
