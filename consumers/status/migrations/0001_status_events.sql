-- Every status event, append-only, one row per event_id.
--
-- Deduplication: Kafka redelivery (a sink restarted before committing, a scheduler re-fire that
-- re-emits the same deterministic event_id) inserts the same event again. ReplacingMergeTree
-- keyed on (job_id, event_id) collapses the copies when parts merge; until then a copy can be
-- in another part, so every reader uses FINAL or an idempotent aggregate (argMax, max, min,
-- uniqExact) and a duplicate never counts twice. The sink also passes an
-- insert_deduplication_token per batch (topic/partition/offset range) so a retried identical
-- batch is dropped at insert time (non_replicated_deduplication_window); a batch rebuilt with
-- other boundaries after a crash is not, which is why the table key is the real guarantee.
--
-- No PARTITION BY: merges (and FINAL) only collapse copies inside one partition, and a
-- re-emitted event may carry a later event_time than its first copy.
--
-- Ordering columns: a job's events are ordered by the token
-- (seq, source_rank, state_rank, event_time_ms), never by arrival; the ranks are MATERIALIZED
-- here so every reader (views, dashboards, ad-hoc SQL) ranks the same way.
CREATE TABLE IF NOT EXISTS status_events
(
    event_id          String,
    job_id            String,
    run_id            Nullable(String),
    seq               Int64,
    attempt           Int32,
    state             LowCardinality(String),
    event_time_ms     Int64,
    source            LowCardinality(String),
    task              Nullable(String),
    scheduled_time_ms Nullable(Int64),
    worker            Nullable(String),
    error             Nullable(String),
    reason            Nullable(String),
    result_json       Nullable(String),
    duration_ms       Nullable(Int64),
    next_fire_ms      Nullable(Int64),
    deadline_ms       Nullable(Int64),
    retry_delay_ms    Nullable(Int64),
    kafka_partition   Int32 DEFAULT -1,
    kafka_offset      Int64 DEFAULT -1,
    ingested_ms       Int64 DEFAULT toUnixTimestamp64Milli(now64(3)),
    event_time        DateTime64(3, 'UTC') MATERIALIZED fromUnixTimestamp64Milli(event_time_ms, 'UTC'),
    source_rank       UInt8 MATERIALIZED if(source = 'worker', 1, 0),
    state_rank        UInt8 MATERIALIZED indexOf(
        ['SCHEDULED', 'RESUMED', 'PAUSED', 'DISPATCHED', 'STARTED', 'HEARTBEAT', 'FAILED',
         'RETRYING', 'SUCCEEDED', 'STALE', 'MISSED', 'SKIPPED', 'DEAD', 'COMPLETED', 'CANCELLED',
         'REJECTED'],
        state)
)
ENGINE = ReplacingMergeTree
ORDER BY (job_id, event_id)
TTL toDateTime(intDiv(event_time_ms, 1000)) + INTERVAL ${ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;
