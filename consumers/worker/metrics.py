"""The worker's metrics and health checks (served by :mod:`jobwheel.metrics`).

The pool counts each run's verdict on its event loop (:class:`WorkerMeters`: a dictionary
addition and a histogram bucket per run, no lock); :class:`WorkerCollector` reads the rest
when Prometheus scrapes. Names (all ``jobwheel_worker_*``); every series also carries ``queue``,
the pool it is about (a worker process serves one pool per ``--queue``):

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
consumers_replaced_total         counter   runs consumers replaced: out of their group (no
                                           partition, no member id) for 3 session timeouts
                                           with Kafka reachable, a client that stopped joining
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

from collections.abc import Callable, Iterator, Sequence
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
    #: Consumer thread: runs consumers replaced because they stayed out of their group.
    consumers_replaced: int = 0

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
    """Reads the running pools of one worker process (one per queue it serves,
    :class:`~jobwheel.consumers.worker.pool.WorkerPool`) at scrape time; every series carries
    its pool's ``queue``."""

    def __init__(self, pools: WorkerPool | Sequence[WorkerPool]) -> None:
        from jobwheel.consumers.worker.pool import WorkerPool

        self.pools: tuple[WorkerPool, ...] = (
            (pools,) if isinstance(pools, WorkerPool) else tuple(pools)
        )
        if not self.pools:
            raise ValueError("a worker collector needs at least one pool")

    def checks(self) -> dict[str, tuple[Check | None, Check | None]]:
        # The pools share one event loop: it turned when any of them saw it turn.
        live = loop_check(
            "worker's event loop",
            lambda: max(pool.turned_at for pool in self.pools),
            self.pools[0].settings.health_live_after_ms / 1000,
        )
        return {"loop": (live, None), "group": (None, self._ready)}

    def _ready(self) -> tuple[bool, str]:
        said = []
        for pool in self.pools:
            group = pool.group
            if pool.stopping:
                return False, "stopping: runs in flight finish or are handed back"
            if not pool.joined:
                return False, f"not in the group {group} yet"
            said.append(f"member of the group {group}, runs partitions {pool.partitions}")
        return True, "; ".join(said)

    def collect(self) -> Iterator[Metric]:
        pools, n = self.pools, PREFIX

        def per_pool(values: Callable[[WorkerPool], float]) -> dict[tuple[str, ...], float]:
            return {(pool.queue,): values(pool) for pool in pools}

        yield counter(
            n + "runs_total",
            "Verdicts sent, by queue, task and state (SUCCEEDED, FAILED, STALE).",
            {(p.queue, *key): v for p in pools for key, v in list(p.meters.runs.items())},
            ("queue", "task", "state"),
        )
        yield histogram(
            n + "run_duration_seconds",
            "Execution time of SUCCEEDED and FAILED runs, by queue and task.",
            {(p.queue, *key): h for p in pools for key, h in list(p.meters.durations.items())},
            ("queue", "task"),
            scale=MS,
        )
        yield counter(
            n + "handed_back_total",
            "Runs handed back at shutdown or when their partition moved.",
            per_pool(lambda p: p.meters.handed_back),
            ("queue",),
        )
        yield counter(
            n + "skipped_done_total",
            "Runs skipped: their partition's previous owner had finished them.",
            per_pool(lambda p: p.meters.inherited_done),
            ("queue",),
        )
        yield counter(
            n + "undecodable_runs_total",
            "Runs records that did not decode: dead-lettered (their run FAILED if named).",
            per_pool(lambda p: p.meters.undecodable),
            ("queue",),
        )
        yield counter(
            n + "consumers_replaced_total",
            "Runs consumers replaced because they stayed out of their group with Kafka "
            "reachable (a client that stopped joining it).",
            per_pool(lambda p: p.meters.consumers_replaced),
            ("queue",),
        )
        yield gauge(
            n + "inflight_runs", "Runs executing now.", per_pool(lambda p: p.inflight), ("queue",)
        )
        yield gauge(
            n + "waiting_runs",
            "Runs fetched, waiting for a slot.",
            per_pool(lambda p: p.waiting),
            ("queue",),
        )
        yield gauge(
            n + "concurrency",
            "Runs that may execute at once.",
            per_pool(lambda p: p.concurrency),
            ("queue",),
        )
        yield gauge(
            n + "partitions",
            "Runs partitions assigned.",
            per_pool(lambda p: len(p.partitions)),
            ("queue",),
        )
        yield gauge(
            n + "lag_records",
            "Runs records not fetched yet, per queue and partition.",
            {(p.queue, str(part)): v for p in pools for part, v in list(p.lag.items())},
            ("queue", "partition"),
        )
