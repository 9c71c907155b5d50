-- A job's task (and a run's) is the task of its latest event that names one, by the ordering
-- token, like every other column of `jobs` and `runs`.
--
-- Until 0007 both were any(task): whichever value a merge met first, which after the merges is
-- the oldest. A job scheduled again under its id with another task (the fix for a misspelt
-- task: `jobwheel submit --id <job> --task <right name>`, then `jobwheel dlq replay`) showed
-- the new task until the parts merged and the old one ever after, in `jobwheel list`,
-- `status`, the console and the API, although every later event carried the new name. A
-- replayed run runs the job's current definition, so a run's task can change the same way.
--
-- job_state and run_state get `latest_task`, max((seq, source_rank, state_rank,
-- event_time_ms, task)) over events that name a task, as the columns of 0007; the `task`
-- columns stay (unread) so the tables need no rebuild. The materialized views are recreated
-- with it and the tables backfilled from status_events: an event inserted meanwhile is counted
-- by a view, the backfill or both, and both is harmless (every aggregate is idempotent). Every
-- statement can run again, so a starter that dies midway is finished by the next one.
DROP VIEW IF EXISTS jobs;

DROP VIEW IF EXISTS runs;

DROP TABLE IF EXISTS job_state_mv;

DROP TABLE IF EXISTS run_state_mv;

ALTER TABLE job_state
    ADD COLUMN IF NOT EXISTS latest_task SimpleAggregateFunction(max, Tuple(Int64, UInt8, UInt8, Int64, Nullable(String)));

ALTER TABLE run_state
    ADD COLUMN IF NOT EXISTS latest_task SimpleAggregateFunction(max, Tuple(Int64, UInt8, UInt8, Int64, Nullable(String)));

CREATE MATERIALIZED VIEW IF NOT EXISTS job_state_mv TO job_state AS
SELECT
    e.job_id AS job_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, if(e.state = 'RESUMED', 'SCHEDULED', e.state)), e.run_id IS NULL AND e.state IN ('SCHEDULED', 'RESUMED', 'PAUSED', 'CANCELLED', 'COMPLETED', 'DEAD')) AS lifecycle,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.run_id), e.run_id IS NOT NULL) AS last_run_id,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.attempt), e.run_id IS NOT NULL) AS attempt,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.next_fire_ms), e.source = 'scheduler') AS next_fire,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.error), e.error IS NOT NULL) AS last_error,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.reason), e.reason IS NOT NULL) AS last_reason,
    max(e.seq) AS seq,
    min(e.event_time_ms) AS created_ms,
    max(e.event_time_ms) AS updated_ms
FROM status_events AS e
GROUP BY e.job_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS run_state_mv TO run_state AS
SELECT
    e.job_id AS job_id,
    assumeNotNull(e.run_id) AS run_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    min(e.scheduled_time_ms) AS scheduled_time_ms,
    minIf(toNullable(e.event_time_ms), e.state = 'DISPATCHED') AS dispatched_ms,
    maxIf(toNullable(e.event_time_ms), e.state = 'STARTED') AS started_ms,
    maxIf(toNullable(e.event_time_ms), e.state = 'HEARTBEAT') AS last_heartbeat_ms,
    max(e.attempt) AS attempts,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.state), e.state != 'HEARTBEAT') AS state,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.worker), e.worker IS NOT NULL) AS worker,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.error), e.error IS NOT NULL) AS error,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.reason), e.reason IS NOT NULL) AS reason,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.duration_ms), e.duration_ms IS NOT NULL) AS duration_ms,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.deadline_ms), e.deadline_ms IS NOT NULL) AS deadline_ms,
    max(e.event_time_ms) AS updated_ms
FROM status_events AS e
WHERE e.run_id IS NOT NULL
GROUP BY e.job_id, e.run_id;

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
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.error), e.error IS NOT NULL) AS last_error,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.reason), e.reason IS NOT NULL) AS last_reason,
    max(e.seq) AS seq,
    min(e.event_time_ms) AS created_ms,
    max(e.event_time_ms) AS updated_ms
FROM status_events AS e
GROUP BY e.job_id;

INSERT INTO run_state (job_id, run_id, task, latest_task, scheduled_time_ms, dispatched_ms,
                       started_ms, last_heartbeat_ms, attempts, state, worker, error, reason,
                       duration_ms, deadline_ms, updated_ms)
SELECT
    e.job_id AS job_id,
    assumeNotNull(e.run_id) AS run_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    min(e.scheduled_time_ms) AS scheduled_time_ms,
    minIf(toNullable(e.event_time_ms), e.state = 'DISPATCHED') AS dispatched_ms,
    maxIf(toNullable(e.event_time_ms), e.state = 'STARTED') AS started_ms,
    maxIf(toNullable(e.event_time_ms), e.state = 'HEARTBEAT') AS last_heartbeat_ms,
    max(e.attempt) AS attempts,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.state), e.state != 'HEARTBEAT') AS state,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.worker), e.worker IS NOT NULL) AS worker,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.error), e.error IS NOT NULL) AS error,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.reason), e.reason IS NOT NULL) AS reason,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.duration_ms), e.duration_ms IS NOT NULL) AS duration_ms,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.deadline_ms), e.deadline_ms IS NOT NULL) AS deadline_ms,
    max(e.event_time_ms) AS updated_ms
FROM status_events AS e
WHERE e.run_id IS NOT NULL
GROUP BY e.job_id, e.run_id;

-- The readable faces, as in 0007, with each task from latest_task.
CREATE VIEW IF NOT EXISTS jobs AS
SELECT
    j.job_id AS job_id,
    max(j.latest_task).5 AS task,
    max(j.lifecycle).5 AS state,
    max(j.lifecycle).4 AS state_time_ms,
    max(j.last_run_id).5 AS last_run_id,
    max(j.attempt).5 AS attempts,
    max(j.next_fire).5 AS next_fire_ms,
    max(j.last_error).5 AS last_error,
    max(j.last_reason).5 AS last_reason,
    max(j.seq) AS seq,
    min(j.created_ms) AS created_ms,
    max(j.updated_ms) AS updated_ms
FROM job_state AS j
GROUP BY j.job_id
HAVING state != '';

CREATE VIEW IF NOT EXISTS runs AS
SELECT
    r.job_id AS job_id,
    r.run_id AS run_id,
    max(r.latest_task).5 AS task,
    min(r.scheduled_time_ms) AS scheduled_time_ms,
    min(r.dispatched_ms) AS dispatched_ms,
    max(r.started_ms) AS started_ms,
    max(r.state).5 AS state,
    if(state IN ('SUCCEEDED', 'FAILED', 'DEAD', 'MISSED', 'SKIPPED', 'STALE'),
       toNullable(max(r.state).4), NULL) AS finished_ms,
    dispatched_ms - scheduled_time_ms AS lateness_ms,
    coalesce(max(r.duration_ms).5, finished_ms - started_ms) AS duration_ms,
    max(r.attempts) AS attempts,
    max(r.worker).5 AS worker,
    max(r.error).5 AS error,
    max(r.reason).5 AS reason,
    max(r.deadline_ms).5 AS deadline_ms,
    max(r.last_heartbeat_ms) AS last_heartbeat_ms,
    max(r.updated_ms) AS updated_ms
FROM run_state AS r
GROUP BY r.job_id, r.run_id;
