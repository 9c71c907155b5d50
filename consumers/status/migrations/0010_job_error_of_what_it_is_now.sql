-- A job's last error and last reason describe the job as it is now: a later success, a new
-- definition or a resume clears them.
--
-- Until 0009 `jobs.last_error` was the error of the job's latest event carrying one, and
-- `last_reason` the reason of the latest carrying one, whatever came after: a job whose run
-- SUCCEEDED on attempt 2 kept attempt 1's error, and a healthy job resumed after a second,
-- refused pause kept "cannot pause: job is already PAUSED" for ever. Now each is taken from
-- the latest event that carries one *or* clears it (SCHEDULED: the job defined again,
-- RESUMED, SUCCEEDED), so after those it is NULL until something sets it again. The events
-- keep every error and reason.
--
-- Only the condition of two columns of job_state_mv changes, to a superset of events: the
-- max over it is at least the max over the old one, so rows the old view wrote merge with the
-- backfill below into the new answer, and the table needs no rebuild. The view is recreated
-- and job_state backfilled from status_events: an event inserted meanwhile is counted by the
-- view, the backfill or both, and both is harmless (every aggregate is idempotent). Every
-- statement can run again, so a starter that dies midway is finished by the next one.
DROP TABLE IF EXISTS job_state_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS job_state_mv TO job_state AS
SELECT
    e.job_id AS job_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, if(e.state = 'RESUMED', 'SCHEDULED', e.state)), e.run_id IS NULL AND e.state IN ('SCHEDULED', 'RESUMED', 'PAUSED', 'CANCELLED', 'COMPLETED', 'DEAD')) AS lifecycle,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.run_id), e.run_id IS NOT NULL) AS last_run_id,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.attempt), e.run_id IS NOT NULL) AS attempt,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.next_fire_ms), e.source = 'scheduler') AS next_fire,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.error), e.error IS NOT NULL OR e.state IN ('SCHEDULED', 'RESUMED', 'SUCCEEDED')) AS last_error,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.reason), e.reason IS NOT NULL OR e.state IN ('SCHEDULED', 'RESUMED', 'SUCCEEDED')) AS last_reason,
    max(e.seq) AS seq,
    min(e.event_time_ms) AS created_ms,
    max(e.event_time_ms) AS updated_ms
FROM status_events AS e
GROUP BY e.job_id;

INSERT INTO job_state (job_id, task, latest_task, lifecycle, last_run_id, attempt, next_fire,
                       last_error, last_reason, seq, created_ms, updated_ms)
SELECT
    e.job_id AS job_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, if(e.state = 'RESUMED', 'SCHEDULED', e.state)), e.run_id IS NULL AND e.state IN ('SCHEDULED', 'RESUMED', 'PAUSED', 'CANCELLED', 'COMPLETED', 'DEAD')) AS lifecycle,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.run_id), e.run_id IS NOT NULL) AS last_run_id,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.attempt), e.run_id IS NOT NULL) AS attempt,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.next_fire_ms), e.source = 'scheduler') AS next_fire,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.error), e.error IS NOT NULL OR e.state IN ('SCHEDULED', 'RESUMED', 'SUCCEEDED')) AS last_error,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.reason), e.reason IS NOT NULL OR e.state IN ('SCHEDULED', 'RESUMED', 'SUCCEEDED')) AS last_reason,
    max(e.seq) AS seq,
    min(e.event_time_ms) AS created_ms,
    max(e.event_time_ms) AS updated_ms
FROM status_events AS e
GROUP BY e.job_id;
