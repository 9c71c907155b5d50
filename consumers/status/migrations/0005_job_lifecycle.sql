-- A job's state is its own, not the state of its latest event (README, "Job states").
--
-- Until 0004, `jobs.state` was the state of the job's greatest-token event of any kind, so a
-- run's DISPATCHED or DEAD, or a REJECTED answer to a command, became "the job's state": a
-- paused job that was triggered showed DEAD, a second cancel made a cancelled job REJECTED,
-- and a cancel of a made-up id created a job row. Now only job-level events (no run_id) move
-- it: SCHEDULED, PAUSED, RESUMED (which returns the job to SCHEDULED), CANCELLED, and at the
-- end COMPLETED or DEAD. Run states stay in `runs`; a REJECTED stays an event on the job.
-- A job id with no job-level event at all (only REJECTED: never scheduled) is not a job, and
-- `jobs` does not list it.
--
-- job_state gets two aggregates for that (`lifecycle`, `lifecycle_time_ms`); the materialized
-- view is recreated with them, and the table is backfilled from status_events. The backfill
-- may count an event the new view also counted, and rows inserted while the view was being
-- replaced are counted by the backfill: every aggregate here is idempotent (argMax, min, max,
-- any), so a copy changes nothing and nothing is missed.
ALTER TABLE job_state
    ADD COLUMN IF NOT EXISTS lifecycle AggregateFunction(argMaxIf, String, Tuple(Int64, UInt8, UInt8, Int64), UInt8);

ALTER TABLE job_state
    ADD COLUMN IF NOT EXISTS lifecycle_time_ms AggregateFunction(argMaxIf, Int64, Tuple(Int64, UInt8, UInt8, Int64), UInt8);

DROP TABLE IF EXISTS job_state_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS job_state_mv TO job_state AS
SELECT
    e.job_id AS job_id,
    any(e.task) AS task,
    argMaxIfState(e.state, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.state != 'HEARTBEAT') AS state,
    argMaxIfState(e.event_time_ms, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.state != 'HEARTBEAT') AS state_time_ms,
    argMaxState(e.run_id, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS last_run_id,
    argMaxIfState(e.attempt, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.run_id IS NOT NULL) AS attempt,
    argMaxIfState(tuple(e.next_fire_ms), tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.source = 'scheduler') AS next_fire,
    argMaxState(e.error, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS last_error,
    argMaxState(e.reason, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS last_reason,
    max(e.seq) AS seq,
    min(e.event_time_ms) AS created_ms,
    max(e.event_time_ms) AS updated_ms,
    argMaxIfState(if(e.state = 'RESUMED', 'SCHEDULED', e.state), tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.run_id IS NULL AND e.state IN ('SCHEDULED', 'RESUMED', 'PAUSED', 'CANCELLED', 'COMPLETED', 'DEAD')) AS lifecycle,
    argMaxIfState(e.event_time_ms, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.run_id IS NULL AND e.state IN ('SCHEDULED', 'RESUMED', 'PAUSED', 'CANCELLED', 'COMPLETED', 'DEAD')) AS lifecycle_time_ms
FROM status_events AS e
GROUP BY e.job_id;

INSERT INTO job_state (job_id, task, state, state_time_ms, last_run_id, attempt, next_fire,
                       last_error, last_reason, seq, created_ms, updated_ms, lifecycle,
                       lifecycle_time_ms)
SELECT
    e.job_id AS job_id,
    any(e.task) AS task,
    argMaxIfState(e.state, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.state != 'HEARTBEAT') AS state,
    argMaxIfState(e.event_time_ms, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.state != 'HEARTBEAT') AS state_time_ms,
    argMaxState(e.run_id, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS last_run_id,
    argMaxIfState(e.attempt, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.run_id IS NOT NULL) AS attempt,
    argMaxIfState(tuple(e.next_fire_ms), tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.source = 'scheduler') AS next_fire,
    argMaxState(e.error, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS last_error,
    argMaxState(e.reason, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS last_reason,
    max(e.seq) AS seq,
    min(e.event_time_ms) AS created_ms,
    max(e.event_time_ms) AS updated_ms,
    argMaxIfState(if(e.state = 'RESUMED', 'SCHEDULED', e.state), tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.run_id IS NULL AND e.state IN ('SCHEDULED', 'RESUMED', 'PAUSED', 'CANCELLED', 'COMPLETED', 'DEAD')) AS lifecycle,
    argMaxIfState(e.event_time_ms, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.run_id IS NULL AND e.state IN ('SCHEDULED', 'RESUMED', 'PAUSED', 'CANCELLED', 'COMPLETED', 'DEAD')) AS lifecycle_time_ms
FROM status_events AS e
GROUP BY e.job_id;

-- `state` and `state_time_ms` are the job's own state now; every other column is as in 0004
-- (last_run_id, attempts, last_error and last_reason still come from all of the job's events,
-- so the latest REJECTED reason or run error shows with the job).
CREATE OR REPLACE VIEW jobs AS
SELECT
    j.job_id AS job_id,
    any(j.task) AS task,
    argMaxIfMerge(j.lifecycle) AS state,
    argMaxIfMerge(j.lifecycle_time_ms) AS state_time_ms,
    argMaxMerge(j.last_run_id) AS last_run_id,
    argMaxIfMerge(j.attempt) AS attempts,
    argMaxIfMerge(j.next_fire).1 AS next_fire_ms,
    argMaxMerge(j.last_error) AS last_error,
    argMaxMerge(j.last_reason) AS last_reason,
    max(j.seq) AS seq,
    min(j.created_ms) AS created_ms,
    max(j.updated_ms) AS updated_ms
FROM job_state AS j
GROUP BY j.job_id
HAVING argMaxIfMerge(j.lifecycle) != '';
