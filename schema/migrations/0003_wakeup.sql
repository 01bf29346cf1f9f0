-- Optional low-latency wake-up for relays started with --wakeup. Off by
-- default: NOTIFY takes a cluster-wide lock at commit, which serializes
-- the commits of notifying transactions. A statement-level trigger sends at
-- most one notification per INSERT statement, and PostgreSQL folds
-- identical notifications of one transaction into one, so a transaction
-- pays for at most one NOTIFY however many events it appends.

CREATE FUNCTION {{schema}}.wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outboxd_wake', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE FUNCTION {{schema}}.enable_wakeup() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DROP TRIGGER IF EXISTS outboxd_wake ON {{schema}}.events;
    CREATE TRIGGER outboxd_wake AFTER INSERT ON {{schema}}.events
        FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.wake();
END
$$;

CREATE FUNCTION {{schema}}.disable_wakeup() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DROP TRIGGER IF EXISTS outboxd_wake ON {{schema}}.events;
END
$$;
