-- A definition's ids query: every source_id of the index, so that the
-- tools that read a whole index from its definition (backfill, reconcile,
-- rebuild --from source) know which ids to ask it for. Optional: the relay
-- needs only the definition, which reads the ids a refresh names.
ALTER TABLE {{schema}}.documents
    ADD COLUMN ids_sql text,
    ADD COLUMN previous_ids_sql text;
