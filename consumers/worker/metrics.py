"""The worker's metrics and health checks (served by :mod:`jobwheel.metrics`).

The pool counts each run's verdict on its event loop (:class:`WorkerMeters`: a dictionary
addition and a histogram bucket per run, no lock); :class:`WorkerCollector` reads the rest
when Prometheus scrapes. Names (all ``jobwheel_worker_*``):

================================ ========= ======================================================
name                             type      what
================================ ========= ======================================================
runs_total{task,state}           counter   verdicts sent: SUCCEEDED, FAILED (a hand-back at
                                           shutdown is a FAILED too), STALE
run_duration_seconds{task}       histogram execution time of SUCCEEDED and FAILED runs
handed_back_total                counter   runs handed back at shutdown or when their partition
                                           moved after the grace (re-dispatched at once)
skipped_done_total               counter   runs not run: the partition's previous owner had
                                           finished them (named in its offset commit)
undecodable_runs_total           counter   runs records no Run could be read from (a newer
                                           schema, damaged bytes): dead-lettered, and their
                                           run answered FAILED when the record names it
inflight_runs                    gauge     runs executing now
waiting_runs                     gauge     runs fetched and waiting for a free slot
concurrency                      gauge     runs that may execute at once
partitions                       gauge     runs partitions assigned to this worker
lag_records{partition}           gauge     runs records not fetched yet (end offset - position,
                                           sampled twice a second by the consumer thread)
================================ ========= ======================================================

Readiness is false until the worker has joined its group and while it stops; liveness is
false when its event loop has not turned for ``JOBWHEEL_HEALTH_LIVE_AFTER_MS`` (an async task
that blocks the loop, e.g. with ``time.sleep``, stalls every run of the process).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobwheel.metrics import (
    Check,
    Collector,
    Histogram,
    LabelLimiter,
    counter,
    gauge,
    histogram,
    loop_check,
)

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from jobwheel.consumers.worker.pool import WorkerPool

PREFIX = "jobwheel_worker_"
#: Run durations in milliseconds (exposed in seconds): from quick tasks to long batch jobs.
DURATION_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 300_000)
MS = 0.001
FINISHED = frozenset({"SUCCEEDED", "FAILED"})


@dataclass
class WorkerMeters:
    """What the pool counts, on its event loop (one writer, no lock)."""

    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    durations: dict[tuple[str], Histogram] = field(default_factory=dict)
    handed_back: int = 0
    #: Consumer thread: runs skipped because the previous owner finished them.
    inherited_done: int = 0
    #: Runs records that did not decode (dead-lettered).
    undecodable: int = 0
    tasks: LabelLimiter = field(default_factory=LabelLimiter)
    #: Runs executed to a verdict (SUCCEEDED or FAILED): the announced finishing rate.
    finished: int = 0

    def verdict(self, task: str, state: str, duration_ms: int | None = None) -> None:
        if state in FINISHED:
            self.finished += 1
        name = self.tasks(task)
        key = (name, state)
        self.runs[key] = self.runs.get(key, 0) + 1
        if duration_ms is not None:
            h = self.durations.get((name,))
            if h is None:
                h = self.durations[(name,)] = Histogram(DURATION_MS)
            h.observe(duration_ms)


class WorkerCollector(Collector):
    """Reads a running :class:`~jobwheel.consumers.worker.pool.WorkerPool` at scrape time."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    def checks(self) -> dict[str, tuple[Check | None, Check | None]]:
        live = loop_check(
            "worker's event loop",
            lambda: self.pool.turned_at,
            self.pool.settings.health_live_after_ms / 1000,
        )
        return {"loop": (live, None), "group": (None, self._ready)}

    def _ready(self) -> tuple[bool, str]:
        pool = self.pool
        group = pool.group
        if pool.stopping:
            return False, "stopping: runs in flight finish or are handed back"
        if not pool.joined:
            return False, f"not in the group {group} yet"
        return True, f"member of the group {group}, runs partitions {pool.partitions}"

    def collect(self) -> Iterator[Metric]:
        pool, meters, n = self.pool, self.pool.meters, PREFIX
        yield counter(
            n + "runs_total",
            "Verdicts sent, by task and state (SUCCEEDED, FAILED, STALE).",
            meters.runs,
            ("task", "state"),
        )
        yield histogram(
            n + "run_duration_seconds",
            "Execution time of SUCCEEDED and FAILED runs, by task.",
            meters.durations,
            ("task",),
            scale=MS,
        )
        yield counter(
            n + "handed_back_total",
            "Runs handed back at shutdown or when their partition moved.",
            meters.handed_back,
        )
        yield counter(
            n + "skipped_done_total",
            "Runs skipped: their partition's previous owner had finished them.",
            meters.inherited_done,
        )
        yield counter(
            n + "undecodable_runs_total",
            "Runs records that did not decode: dead-lettered (their run FAILED if named).",
            meters.undecodable,
        )
        yield gauge(n + "inflight_runs", "Runs executing now.", pool.inflight)
        yield gauge(n + "waiting_runs", "Runs fetched, waiting for a slot.", pool.waiting)
        yield gauge(n + "concurrency", "Runs that may execute at once.", pool.concurrency)
        yield gauge(n + "partitions", "Runs partitions assigned.", len(pool.partitions))
        yield gauge(
            n + "lag_records",
            "Runs records not fetched yet, per partition.",
            {(str(p),): v for p, v in pool.lag.items()},
            ("partition",),
        )
