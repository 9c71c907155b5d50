-- A run shows an error only while its state is a failure, and a duration only once it has
-- finished: both describe the run as it is now, not an attempt before it.
--
-- Until 0008 `runs.error` was the latest error of any of the run's attempts and `duration_ms`
-- the latest attempt's duration, so a run that SUCCEEDED on attempt 2 showed attempt 1's error
-- beside its result, and a run handed back by a stopping worker and running again showed the
-- hand-back's error ("worker shutdown") and duration while it ran. Now `error` is NULL unless
-- the state is FAILED, RETRYING or DEAD (whose error is the failed attempt's), and
-- `duration_ms` NULL unless the run has finished. The events keep every attempt's error.
-- Views only: nothing is stored differently.
CREATE OR REPLACE VIEW runs AS
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
