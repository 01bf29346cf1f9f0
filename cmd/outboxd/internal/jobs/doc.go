// Package jobs runs outboxd's scheduled maintenance (outbox retention,
// tombstone purge, dead-letter auto-retry, reconcile) inside every relay
// process, with each run happening on one replica only.
//
// Contracts:
//
//   - Schedules are robfig/cron/v3 standard specs: five fields
//     ("15 3 * * *") or a descriptor ("@hourly", "@every 1m"). An empty
//     schedule disables the job; RunNow still runs it.
//   - Every run first takes a session advisory lock on a key derived from
//     (schema, job), on a connection held for the run. A replica that
//     cannot take it skips the run and records "skipped: another replica";
//     so however many relays run, a job never runs twice at once.
//   - A run that is still going when its next tick comes is skipped on
//     that replica (cron.SkipIfStillRunning); a panic in a job is recovered
//     and recorded as a failure (the chain's cron.Recover is the last line).
//   - Runs are recorded in <schema>.job_runs (shared by all replicas, so
//     every replica's page shows them) and in the metrics
//     outboxd_job_runs_total, outboxd_job_failures_total,
//     outboxd_job_skips_total and outboxd_job_duration_seconds, labelled
//     job_name (not "job", which Prometheus reserves for the scrape job and
//     would rename to exported_job).
//   - Every run has a deadline (Config.Timeout): its context is cancelled
//     then and the run is recorded as failed ("run timed out after ...").
//   - Stop stops scheduling, cancels the context of running jobs and waits
//     for them to return: jobs must stop promptly when their context ends.
package jobs
