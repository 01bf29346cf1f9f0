-- Which run of `outboxd backfill` owns an index's progress row: one run per
-- index at a time (a session advisory lock), and every progress write is
-- conditional on the run that took the row, so a run that lost its lock
-- never moves another run's stored key.
ALTER TABLE {{schema}}.backfills
    ADD COLUMN run_id text,
    ADD COLUMN run_by text;
