-- Messages travel as events on the index names MessagePrefix || destination
-- (".outboxd-message.<destination>"): the leading dot, which applications
-- may not use, keeps them apart from every real index. The CHECK on
-- index_name lets exactly that namespace through; outbox.append still
-- refuses it, only outbox.append_message writes there.
ALTER TABLE {{schema}}.events
    DROP CONSTRAINT "index_name: not a valid Elasticsearch index name",
    ADD CONSTRAINT "index_name: not a valid Elasticsearch index name"
        CHECK (index_name LIKE '.outboxd-message.%' OR {{schema}}.es_name_problem(index_name) IS NULL) NOT VALID;
