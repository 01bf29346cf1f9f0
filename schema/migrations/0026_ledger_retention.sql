-- Retention of the delivery ledger and the inbox: final ledger rows and
-- inbox rows older than a window are deleted in batches, found by these
-- indexes instead of a scan of every row kept.
CREATE INDEX deliveries_finished ON {{schema}}.deliveries (finished_at)
    WHERE state IN ('delivered', 'failed', 'skipped');
CREATE INDEX inbox_received ON {{schema}}.inbox (received_at);
