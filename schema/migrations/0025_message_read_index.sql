-- A destination's stream reads only its own messages; without an index on
-- the index name each read scanned the whole outbox (every search event)
-- to return a few messages. The index holds only the message namespace, so
-- search events pay nothing for it; the relay's message reads repeat its
-- predicate so that the planner can use it.
CREATE INDEX events_messages ON {{schema}}.events (index_name, xid, id)
    WHERE index_name LIKE '.outboxd-message.%';
