"""A pool's scaling signals from its backlog and its workers' announcements (pure): what an
autoscaler and an operator read in GET /queues, the jobwheel_queue_* metrics and `health`."""

from __future__ import annotations

import json

from jobwheel.consumers.status.pools import PoolCollector, signals
from jobwheel.kafka.admin import Backlog
from jobwheel.schemas import workers as roster

NOW = 100_000


def _worker(
    worker_id: str, group: str, *, inflight: int, rate: float, announced_ms: int = NOW
) -> roster.WorkerRecord:
    return roster.WorkerRecord(
        worker_id, group, ("a.x",), "h", 1, 0, announced_ms, 5_000, inflight, 8, rate
    )


def test_an_announcement_carries_the_workers_load_and_an_older_one_reads_as_idle() -> None:
    record = _worker("h:1", "g", inflight=3, rate=12.5)
    back = roster.decode("h:1", roster.encode(record))
    assert back is not None and (back.inflight, back.concurrency, back.finished_per_s) == (
        3,
        8,
        12.5,
    )
    old = {k: v for k, v in json.loads(roster.encode(record)).items()}
    for key in ("inflight", "concurrency", "finished_per_s"):
        del old[key]  # a worker from before these keys
    older = roster.decode("h:1", json.dumps(old).encode())
    assert older is not None and (older.inflight, older.concurrency, older.finished_per_s) == (
        0,
        0,
        0.0,
    )
    hostile = roster.decode("h:1", roster.encode(record).replace(b"12.5", b"NaN"))
    assert hostile is not None and hostile.finished_per_s == 0.0


def test_signals_sum_the_live_workers_of_the_pools_group_only() -> None:
    backlog = {0: Backlog(10, NOW - 4_000), 1: Backlog(0), 2: Backlog(5, NOW - 1_000)}
    workers = [
        _worker("a:1", "jw-workers-a", inflight=3, rate=2.0),
        _worker("a:2", "jw-workers-a", inflight=4, rate=1.5),
        _worker("b:1", "jw-workers-b", inflight=8, rate=9.0),  # another pool
        _worker("a:3", "jw-workers-a", inflight=8, rate=9.0, announced_ms=NOW - 60_000),  # dead
    ]
    got = signals("a", "jw-workers-a", "jw.runs.a", backlog, workers, NOW)
    assert (got.unfinished, got.inflight, got.waiting) == (15, 7, 8)
    assert got.oldest_unfinished_age_s == 4.0  # the oldest partition's first unfinished run
    assert (got.workers, got.concurrency, got.finished_per_s) == (2, 16, 3.5)


def test_an_idle_pool_reads_zero_and_an_unread_one_reads_unknown() -> None:
    idle = signals("a", "g", "t", {0: Backlog(0), 1: Backlog(0)}, [], NOW)
    assert (idle.unfinished, idle.waiting, idle.oldest_unfinished_age_s) == (0, 0, 0.0)
    # More running than the offsets say (a worker's count is newer than the commit): no
    # negative waiting.
    running = [_worker("w", "g", inflight=3, rate=0)]
    busy = signals("a", "g", "t", {0: Backlog(1, NOW)}, running, NOW)
    assert busy.waiting == 0
    down = signals("a", "g", "t", None, [], NOW, error="Kafka did not answer")
    assert (down.unfinished, down.waiting, down.oldest_unfinished_age_s) == (None, None, None)


def test_the_metrics_leave_out_a_pool_kafka_did_not_answer_for() -> None:
    class Reader:
        def pools(self) -> list:
            return [
                signals("a", "g", "t", {0: Backlog(7, NOW - 2_000)}, [], NOW),
                signals("b", "g-b", "t.b", None, [], NOW, error="down"),
            ]

    families = {m.name: m for m in PoolCollector(Reader()).collect()}  # type: ignore[arg-type]
    unfinished = families["jobwheel_queue_unfinished_runs"].samples
    assert [(s.labels, s.value) for s in unfinished] == [({"queue": "a"}, 7)]
    age = families["jobwheel_queue_oldest_unfinished_age_seconds"].samples
    assert [s.value for s in age] == [2.0]
