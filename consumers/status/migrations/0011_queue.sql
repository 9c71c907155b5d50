-- Queues in the status store: every event names its queue (status_event.v4: a scheduler's
-- event the job's queue, a worker's the queue it serves), and `jobs` and `runs` show it, so
-- `jobwheel list --queue`, GET /jobs?queue= and the dashboards can go by pool.
--
-- status_events gets `queue`; job_state and run_state get `latest_queue`, the queue of the
-- latest event that names one by the ordering token, like latest_task (0008): a job moved to
-- another queue shows the new one. Events of older writers name no queue, but a job's
-- SCHEDULED events since status_event.v3 carry its definition, which names it (a definition
-- from before queues names none: the job's queue is `default`, the only one there was); so
-- job_state takes the queue from spec_json where the event has none. A run whose events name
-- no queue (dispatched before this version) has queue NULL: not known.
--
-- As in 0008 the materialized views are recreated with the column and the tables backfilled
-- from status_events (every aggregate is idempotent, so a row counted by a view and the
-- backfill both is harmless, and a backfill from some of a key's events merges with the rest).
-- job_state is backfilled from every event (its queue comes from old definitions too);
-- run_state only from the events ingested in the last hour, which covers those a sink
-- inserted while its view was being recreated (older events have no queue to add). Every
-- statement can run again, so a starter that dies midway is finished by the next one.
DROP VIEW IF EXISTS jobs;

DROP VIEW IF EXISTS runs;

DROP TABLE IF EXISTS job_state_mv;

DROP TABLE IF EXISTS run_state_mv;

ALTER TABLE status_events ADD COLUMN IF NOT EXISTS queue Nullable(String) AFTER spec_json;

ALTER TABLE job_state
    ADD COLUMN IF NOT EXISTS latest_queue SimpleAggregateFunction(max, Tuple(Int64, UInt8, UInt8, Int64, Nullable(String)));

ALTER TABLE run_state
    ADD COLUMN IF NOT EXISTS latest_queue SimpleAggregateFunction(max, Tuple(Int64, UInt8, UInt8, Int64, Nullable(String)));

CREATE MATERIALIZED VIEW IF NOT EXISTS job_state_mv TO job_state AS
SELECT
    e.job_id AS job_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, coalesce(e.queue, JSONExtract(ifNull(e.spec_json, ''), 'queue', 'Nullable(String)'))), e.queue IS NOT NULL OR e.spec_json IS NOT NULL) AS latest_queue,
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

CREATE MATERIALIZED VIEW IF NOT EXISTS run_state_mv TO run_state AS
SELECT
    e.job_id AS job_id,
    assumeNotNull(e.run_id) AS run_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.queue), e.queue IS NOT NULL) AS latest_queue,
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

INSERT INTO job_state (job_id, task, latest_task, latest_queue, lifecycle, last_run_id, attempt, next_fire,
                       last_error, last_reason, seq, created_ms, updated_ms)
SELECT
    e.job_id AS job_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, coalesce(e.queue, JSONExtract(ifNull(e.spec_json, ''), 'queue', 'Nullable(String)'))), e.queue IS NOT NULL OR e.spec_json IS NOT NULL) AS latest_queue,
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

INSERT INTO run_state (job_id, run_id, task, latest_task, latest_queue, scheduled_time_ms, dispatched_ms,
                       started_ms, last_heartbeat_ms, attempts, state, worker, error, reason,
                       duration_ms, deadline_ms, updated_ms)
SELECT
    e.job_id AS job_id,
    assumeNotNull(e.run_id) AS run_id,
    any(e.task) AS task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.task), e.task IS NOT NULL) AS latest_task,
    maxIf(tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms, e.queue), e.queue IS NOT NULL) AS latest_queue,
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
  AND e.ingested_ms >= toUnixTimestamp64Milli(now64(3)) - 3600000
GROUP BY e.job_id, e.run_id;

-- The readable faces, as in 0008 and 0009, with the queue.
CREATE VIEW IF NOT EXISTS jobs AS
SELECT
    j.job_id AS job_id,
    max(j.latest_task).5 AS task,
    ifNull(max(j.latest_queue).5, 'default') AS queue,
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
    max(r.latest_queue).5 AS queue,
    min(r.scheduled_time_ms) AS scheduled_time_ms,
    min(r.dispatched_ms) AS dispatched_ms,
    max(r.started_ms) AS started_ms,
    max(r.state).5 AS state,
    if(state IN ('SUCCEEDED', 'FAILED', 'DEAD', 'MISSED', 'SKIPPED', 'STALE'),
       toNullable(max(r.state).4), NULL) AS finished_ms,
    dispatched_ms - scheduled_time_ms AS lateness_ms,
    if(finished_ms IS NULL, NULL, coalesce(max(r.duration_ms).5, finished_ms - started_ms)) AS duration_ms,
    max(r.attempts) AS attempts,
    max(r.worker).5 AS worker,
    if(state IN ('FAILED', 'RETRYING', 'DEAD'), max(r.error).5, NULL) AS error,
    max(r.reason).5 AS reason,
    max(r.deadline_ms).5 AS deadline_ms,
    max(r.last_heartbeat_ms) AS last_heartbeat_ms,
    max(r.updated_ms) AS updated_ms
FROM run_state AS r
GROUP BY r.job_id, r.run_id;
