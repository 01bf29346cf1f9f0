-- The index keeps its own fields in every document: outboxd_deleted marks
-- a delete's tombstone (hidden from the index name's alias, purged after
-- the tombstone horizon) and outboxd_deleted_at dates it. A user document
-- carrying either at its top level would be hidden or purged as a
-- tombstone, so no path may write one into the outbox: append, the capture
-- trigger (it appends) and COPY (AppendBatch) all meet this constraint.
-- NOT VALID: an existing outbox is upgraded in place without a scan; the
-- sink dead-letters any such event already written.
ALTER TABLE {{schema}}.events
    ADD CONSTRAINT "document: outboxd_deleted, outboxd_deleted_at are reserved"
        CHECK (document IS NULL OR NOT (document ?| ARRAY['outboxd_deleted', 'outboxd_deleted_at'])) NOT VALID;
