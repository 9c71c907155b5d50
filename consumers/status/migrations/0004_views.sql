-- The readable faces of job_state and run_state: plain columns, aggregation finished. The API,
-- the CLI, the dashboards and ad-hoc SQL (`jobwheel sql`) all read these, so there is one
-- definition of "current state", "finished", "lateness" and "duration". Raw columns are
-- qualified (j., r.) because the output aliases reuse their names.
CREATE VIEW IF NOT EXISTS jobs AS
SELECT
    j.job_id AS job_id,
    any(j.task) AS task,
    argMaxIfMerge(j.state) AS state,
    argMaxIfMerge(j.state_time_ms) AS state_time_ms,
    argMaxMerge(j.last_run_id) AS last_run_id,
    argMaxIfMerge(j.attempt) AS attempts,
    argMaxIfMerge(j.next_fire).1 AS next_fire_ms,
    argMaxMerge(j.last_error) AS last_error,
    argMaxMerge(j.last_reason) AS last_reason,
    max(j.seq) AS seq,
    min(j.created_ms) AS created_ms,
    max(j.updated_ms) AS updated_ms
FROM job_state AS j
GROUP BY j.job_id;

CREATE VIEW IF NOT EXISTS runs AS
SELECT
    r.job_id AS job_id,
    r.run_id AS run_id,
    any(r.task) AS task,
    min(r.scheduled_time_ms) AS scheduled_time_ms,
    min(r.dispatched_ms) AS dispatched_ms,
    max(r.started_ms) AS started_ms,
    argMaxIfMerge(r.state) AS state,
    if(state IN ('SUCCEEDED', 'FAILED', 'DEAD', 'MISSED', 'SKIPPED', 'STALE'),
       toNullable(argMaxIfMerge(r.state_time_ms)), NULL) AS finished_ms,
    dispatched_ms - scheduled_time_ms AS lateness_ms,
    coalesce(argMaxMerge(r.duration_ms), finished_ms - started_ms) AS duration_ms,
    max(r.attempts) AS attempts,
    argMaxMerge(r.worker) AS worker,
    argMaxMerge(r.error) AS error,
    argMaxMerge(r.reason) AS reason,
    argMaxMerge(r.deadline_ms) AS deadline_ms,
    max(r.last_heartbeat_ms) AS last_heartbeat_ms,
    max(r.updated_ms) AS updated_ms
FROM run_state AS r
GROUP BY r.job_id, r.run_id;
