-- One row per run (run_id), all attempts of it, kept by a materialized view over status_events.
-- Same rules as job_state: idempotent aggregates only, ordered by the token, not by arrival.
-- dispatched_ms is the first dispatch (lateness = first dispatch - scheduled time: how late the
-- scheduler fired); started_ms is the latest attempt's start; HEARTBEAT moves deadline_ms and
-- last_heartbeat_ms but is not a state. Read it through the `runs` view (0004).
CREATE TABLE IF NOT EXISTS run_state
(
    job_id            String,
    run_id            String,
    task              SimpleAggregateFunction(any, Nullable(String)),
    scheduled_time_ms SimpleAggregateFunction(min, Nullable(Int64)),
    dispatched_ms     SimpleAggregateFunction(min, Nullable(Int64)),
    started_ms        SimpleAggregateFunction(max, Nullable(Int64)),
    last_heartbeat_ms SimpleAggregateFunction(max, Nullable(Int64)),
    attempts          SimpleAggregateFunction(max, Int32),
    state             AggregateFunction(argMaxIf, String, Tuple(Int64, UInt8, UInt8, Int64), UInt8),
    state_time_ms     AggregateFunction(argMaxIf, Int64, Tuple(Int64, UInt8, UInt8, Int64), UInt8),
    worker            AggregateFunction(argMax, Nullable(String), Tuple(Int64, UInt8, UInt8, Int64)),
    error             AggregateFunction(argMax, Nullable(String), Tuple(Int64, UInt8, UInt8, Int64)),
    reason            AggregateFunction(argMax, Nullable(String), Tuple(Int64, UInt8, UInt8, Int64)),
    duration_ms       AggregateFunction(argMax, Nullable(Int64), Tuple(Int64, UInt8, UInt8, Int64)),
    deadline_ms       AggregateFunction(argMax, Nullable(Int64), Tuple(Int64, UInt8, UInt8, Int64)),
    updated_ms        SimpleAggregateFunction(max, Int64)
)
ENGINE = AggregatingMergeTree
ORDER BY (job_id, run_id)
TTL toDateTime(intDiv(updated_ms, 1000)) + INTERVAL ${ttl_days} DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS run_state_mv TO run_state AS
SELECT
    e.job_id AS job_id,
    assumeNotNull(e.run_id) AS run_id,
    any(e.task) AS task,
    min(e.scheduled_time_ms) AS scheduled_time_ms,
    minIf(toNullable(e.event_time_ms), e.state = 'DISPATCHED') AS dispatched_ms,
    maxIf(toNullable(e.event_time_ms), e.state = 'STARTED') AS started_ms,
    maxIf(toNullable(e.event_time_ms), e.state = 'HEARTBEAT') AS last_heartbeat_ms,
    max(e.attempt) AS attempts,
    argMaxIfState(e.state, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.state != 'HEARTBEAT') AS state,
    argMaxIfState(e.event_time_ms, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms), e.state != 'HEARTBEAT') AS state_time_ms,
    argMaxState(e.worker, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS worker,
    argMaxState(e.error, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS error,
    argMaxState(e.reason, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS reason,
    argMaxState(e.duration_ms, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS duration_ms,
    argMaxState(e.deadline_ms, tuple(e.seq, e.source_rank, e.state_rank, e.event_time_ms)) AS deadline_ms,
    max(e.event_time_ms) AS updated_ms
FROM status_events AS e
WHERE e.run_id IS NOT NULL
GROUP BY e.job_id, e.run_id;
