-- Current state of each job, kept by a materialized view over status_events.
--
-- Every column is an idempotent aggregate (argMax over the ordering token, min, max, any), so
-- the answer does not depend on arrival order and a duplicated event changes nothing: the
-- view sees every inserted copy, and argMax of the same (value, token) twice is that value.
-- HEARTBEAT is not a state change (it only moves the run's deadline), so `state` ignores it.
-- next_fire is the value of the latest *scheduler* event, NULL included (a NULL there means
-- "no next fire": completed, cancelled, paused), hence the one-element tuple, which argMax does
-- not skip the way it skips a bare NULL.
-- Read it through the `jobs` view (0004) which finishes the aggregation.
CREATE TABLE IF NOT EXISTS job_state
(
    job_id        String,
    task          SimpleAggregateFunction(any, Nullable(String)),
    state         AggregateFunction(argMaxIf, String, Tuple(Int64, UInt8, UInt8, Int64), UInt8),
    state_time_ms AggregateFunction(argMaxIf, Int64, Tuple(Int64, UInt8, UInt8, Int64), UInt8),
    last_run_id   AggregateFunction(argMax, Nullable(String), Tuple(Int64, UInt8, UInt8, Int64)),
    attempt       AggregateFunction(argMaxIf, Int32, Tuple(Int64, UInt8, UInt8, Int64), UInt8),
    next_fire     AggregateFunction(argMaxIf, Tuple(Nullable(Int64)), Tuple(Int64, UInt8, UInt8, Int64), UInt8),
    last_error    AggregateFunction(argMax, Nullable(String), Tuple(Int64, UInt8, UInt8, Int64)),
    last_reason   AggregateFunction(argMax, Nullable(String), Tuple(Int64, UInt8, UInt8, Int64)),
    seq           SimpleAggregateFunction(max, Int64),
    created_ms    SimpleAggregateFunction(min, Int64),
    updated_ms    SimpleAggregateFunction(max, Int64)
)
ENGINE = AggregatingMergeTree
ORDER BY job_id
TTL toDateTime(intDiv(updated_ms, 1000)) + INTERVAL ${ttl_days} DAY;

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
    max(e.event_time_ms) AS updated_ms
FROM status_events AS e
GROUP BY e.job_id;
