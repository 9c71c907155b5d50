"""Each worker pool's signals to scale on: how much it has not finished, how much runs, how old
the oldest of it is, how fast it finishes.

A pool is a queue (``JOBWHEEL_QUEUES``): its runs topic and its workers' consumer group
(README, docs/operations.md). Two sources, both in Kafka, so the status service reports them
whatever the store holds:

- the group's committed offsets against the topic's end: the runs a pool has not committed
  past (:func:`jobwheel.kafka.admin.group_backlog`), and the broker timestamp of the oldest of
  them. A worker commits a partition up to its oldest unfinished run, so these are the runs
  waiting *or* running: ``unfinished``, the lag an autoscaler (KEDA's Kafka scaler) reads;
- the workers' announcements on the workers topic (:mod:`jobwheel.schemas.workers`): per live
  worker of the pool's group, runs executing, concurrency and runs finished per second.

``waiting`` is ``unfinished - inflight``: the runs no slot has taken yet, the number to scale
on. Metric names (all ``jobwheel_queue_*``, label ``queue``; served by ``jobwheel serve`` on
``JOBWHEEL_METRICS_PORT`` and as ``GET /queues``):

================================ ======= =========================================================
name                             type    what
================================ ======= =========================================================
unfinished_runs                  gauge   runs past the group's committed offsets (its lag)
inflight_runs                    gauge   runs executing on the pool's live workers
waiting_runs                     gauge   unfinished runs no worker executes yet
oldest_unfinished_age_seconds    gauge   age of the oldest unfinished run (0: none)
finished_runs_per_second         gauge   runs the live workers finished per second, last interval
workers                          gauge   live workers in the pool
concurrency                      gauge   runs the live workers may execute at once
================================ ======= =========================================================

A pool Kafka did not answer for is left out of the metrics (a scrape says nothing rather than
a wrong zero) and shows its error in ``GET /queues``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from jobwheel.metrics import Collector, gauge

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from jobwheel.kafka.admin import Backlog
    from jobwheel.schemas.workers import WorkerRecord
    from jobwheel.settings import Settings

PREFIX = "jobwheel_queue_"
#: How long one read of every pool's signals serves (a scrape every few seconds, and the API,
#: read Kafka at most this often).
SIGNALS_TTL_S = 5.0


@dataclass(frozen=True, slots=True)
class PoolSignals:
    """One pool (queue) now. Counts from Kafka are None when Kafka did not answer (``error``)."""

    queue: str
    group: str
    topic: str
    unfinished: int | None
    waiting: int | None
    inflight: int
    oldest_unfinished_age_s: float | None
    finished_per_s: float
    workers: int
    concurrency: int
    read_at_ms: int
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def signals(
    queue: str,
    group: str,
    topic: str,
    backlog: Mapping[int, Backlog] | None,
    workers: Iterable[WorkerRecord],
    now_ms: int,
    error: str | None = None,
) -> PoolSignals:
    """A pool's signals from its backlog per partition (None: not read) and the live workers'
    announcements (those of other groups are skipped). Pure."""
    mine = [w for w in workers if w.group == group and w.is_live(now_ms)]
    inflight = sum(w.inflight for w in mine)
    unfinished = waiting = age = None
    if backlog is not None:
        unfinished = sum(b.unfinished for b in backlog.values())
        waiting = max(0, unfinished - inflight)
        stamps = [b.oldest_ms for b in backlog.values() if b.unfinished and b.oldest_ms]
        age = max(0.0, (now_ms - min(stamps)) / 1000) if stamps else 0.0
    return PoolSignals(
        queue=queue,
        group=group,
        topic=topic,
        unfinished=unfinished,
        waiting=waiting,
        inflight=inflight,
        oldest_unfinished_age_s=age,
        finished_per_s=round(sum(w.finished_per_s for w in mine), 3),
        workers=len(mine),
        concurrency=sum(w.concurrency for w in mine),
        read_at_ms=now_ms,
        error=error,
    )


def read_pools(settings: Settings, timeout_s: float = 5.0) -> list[PoolSignals]:
    """Every queue's signals, read from Kafka now (an error per pool as text)."""
    from jobwheel.kafka import admin
    from jobwheel.kafka.errors import error_text
    from jobwheel.kafka.queues import QueueDirectory, admin_topic_lister
    from jobwheel.producers.workers import read_workers

    workers: tuple[WorkerRecord, ...] = ()
    roster_error = None
    try:
        roster = read_workers(settings, timeout_s)
        if roster is None:
            roster_error = f"no topic {settings.topics.workers}: run `jobwheel topics ensure`"
        else:
            workers = roster.workers
    except Exception as exc:
        roster_error = f"reading the workers topic: {error_text(exc)}"
    out = []
    # JOBWHEEL_QUEUES and the queues added at run time (`jobwheel queues add`).
    queues = QueueDirectory(settings, admin_topic_lister(settings, __name__)).names(refresh=True)
    for queue in queues:
        group, topic = settings.worker_group_for(queue), settings.topics.runs_for(queue)
        backlog: dict[int, Backlog] | None = None
        error = roster_error
        try:
            backlog = admin.group_backlog(settings, group, topic, timeout_s, __name__)
        except Exception as exc:
            error = error_text(exc)
        out.append(signals(queue, group, topic, backlog, workers, _now_ms(), error))
    return out


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class PoolReader:
    """The latest :func:`read_pools`, read again when older than :data:`SIGNALS_TTL_S`.
    Thread-safe: one read at a time, the others wait for it and share it."""

    def __init__(self, settings: Settings, ttl_s: float = SIGNALS_TTL_S) -> None:
        self.settings = settings
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._read: tuple[float, list[PoolSignals]] | None = None

    def pools(self) -> list[PoolSignals]:
        with self._lock:
            if self._read is None or time.monotonic() - self._read[0] >= self._ttl_s:
                self._read = (time.monotonic(), read_pools(self.settings))
            return self._read[1]


class PoolCollector(Collector):
    """The pools' signals as Prometheus gauges, from a :class:`PoolReader` at scrape time."""

    def __init__(self, reader: PoolReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        found = [p for p in self.reader.pools() if p.error is None]
        n, label = PREFIX, ("queue",)

        def per_queue(name: str, doc: str, value: Any) -> Metric:
            return gauge(n + name, doc, {(p.queue,): value(p) for p in found}, label)

        yield per_queue(
            "unfinished_runs",
            "Runs past the pool's committed offsets (waiting or running): its lag.",
            lambda p: p.unfinished,
        )
        yield per_queue("inflight_runs", "Runs executing on live workers.", lambda p: p.inflight)
        yield per_queue(
            "waiting_runs", "Unfinished runs no worker executes yet.", lambda p: p.waiting
        )
        yield per_queue(
            "oldest_unfinished_age_seconds",
            "Age of the oldest unfinished run (0: none).",
            lambda p: p.oldest_unfinished_age_s,
        )
        yield per_queue(
            "finished_runs_per_second",
            "Runs the live workers finished per second over their last interval.",
            lambda p: p.finished_per_s,
        )
        yield per_queue("workers", "Live workers in the pool.", lambda p: p.workers)
        yield per_queue(
            "concurrency", "Runs the live workers may execute at once.", lambda p: p.concurrency
        )
