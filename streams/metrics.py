"""The scheduler's metrics and health checks (served by :mod:`jobwheel.metrics`).

The engine keeps its counters where it already works (:class:`~jobwheel.streams.engine.EngineStats`,
and :class:`EngineMeters` here for what needs labels or a histogram); everything else is read
when Prometheus scrapes, by :class:`SchedulerCollector`: partitions and their phase, restore
progress, consumer lag, the age of each partition's last commit. What the hot path pays per
job is a few dictionary additions and, per run, one tuple appended (its lateness is measured
when its transaction commits, i.e. when workers can see it).

Names (all ``jobwheel_scheduler_*``; seconds and ``_total`` as Prometheus wants them):

====================================== ========= ============================================
name                                   type      what
====================================== ========= ============================================
commands_total                         counter   commands applied (``kind`` is not split)
acks_total                             counter   worker acknowledgements applied
fires_total                            counter   runs dispatched as first attempts, committed
retries_total                          counter   runs dispatched again (attempt > 1)
runs_total{task,state}                 counter   run events the scheduler wrote (DISPATCHED,
                                                 RETRYING, DEAD, MISSED, SKIPPED, CANCELLED)
job_events_total{state}                counter   job events (SCHEDULED, PAUSED, COMPLETED, ...)
rejected_total                         counter   commands and acks refused (dead-lettered)
dead_letters_total{kind}               counter   records to the dead-letter topic, by the kind
                                                 ``jobwheel dlq list --kind`` takes: ``dead-run``,
                                                 ``request``, ``ack``, ``too-large``
replays_total                          counter   commands replayed from the dead letters
                                                 (``jobwheel dlq replay``)
refused_changes_total{reason}          counter   changes refused or undone, each with its
                                                 event: ``record-too-large`` (a job record
                                                 past JOBWHEEL_SCHEDULER_MAX_RECORD_BYTES),
                                                 ``timer-failed`` (the job paused or its run
                                                 ended DEAD)
fire_lateness_seconds                  histogram commit of a first attempt - its scheduled time
transactions_total                     counter   transactions committed
transaction_aborts_total               counter   transactions aborted (batch processed again)
resets_total                           counter   fenced or fatal: every partition restored again
commit_seconds                         histogram one transaction, begin to committed
transaction_phase_seconds_total{phase} counter   where the transactions' time went: ``open``
                                                 (its work waiting for the commit, from the
                                                 poll that began it), ``produce`` (its records
                                                 handed to the producer), ``offsets`` (the
                                                 consumed offsets added), ``end`` (the commit
                                                 call), ``state`` (the local state written
                                                 after it); a run fired into a transaction is
                                                 visible to workers after ``end``
clock_skew_seconds                     gauge     this host's clock minus the broker's (as read)
issue_times_clamped_total              counter   commands whose issue time was held to the
                                                 broker's (JOBWHEEL_SCHEDULER_CLOCK_TOLERANCE_MS)
last_commit_timestamp_seconds          gauge     wall clock of the last commit
partitions{phase}                      gauge     partitions held: ready, restoring, standby
partition_phase{partition,phase}       gauge     1 per partition held, by phase
restore_remaining_records{partition}   gauge     changelog offsets left to restore
restored_records_total                 counter   changelog records applied by restores
restore_seconds                        histogram assignment to ready, per partition
lag_records{topic,partition}           gauge     requests/acks records not yet read
partition_commit_age_seconds{partition} gauge    since the partition's last commit (ready ones)
stuck_partitions                       gauge     partitions with work waiting and no commit
                                                 for JOBWHEEL_HEALTH_STUCK_AFTER_MS
====================================== ========= ============================================

Readiness (``/health/ready``) is false while the process is not connected, while any
partition it owns is restoring, and while a partition is stuck (the rule of
:func:`jobwheel.schemas.progress.stuck_reason`, applied to what this process knows first-hand);
liveness is false when the loop has not turned for ``JOBWHEEL_HEALTH_LIVE_AFTER_MS``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
from jobwheel.schemas.progress import stuck_reason

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from jobwheel.streams.engine import SchedulerEngine
    from jobwheel.streams.processor import Output

PREFIX = "jobwheel_scheduler_"
#: Fire lateness bounds in milliseconds (exposed in seconds): the target is p99 < 100 ms and
#: never more than 2 s, so the buckets are fine below a second.
LATENESS_MS = (5, 10, 25, 50, 75, 100, 150, 250, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000)
COMMIT_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000)
RESTORE_MS = (100, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 300_000, 900_000)
MS = 0.001
#: The parts of a committed transaction's time, in order (:meth:`EngineMeters.phases`).
TRANSACTION_PHASES = ("open", "produce", "offsets", "end", "state")
#: Names read outside the process too (``load.e2e`` sums the phases over a run).
TRANSACTIONS_TOTAL = PREFIX + "transactions_total"
TRANSACTION_PHASE_SECONDS = PREFIX + "transaction_phase_seconds_total"


@dataclass
class EngineMeters:
    """What the engine counts for metrics, on its own thread (one writer, no lock)."""

    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    job_events: dict[tuple[str], int] = field(default_factory=dict)
    dead_letters: dict[tuple[str], int] = field(default_factory=dict)
    refusals: dict[tuple[str], int] = field(default_factory=dict)
    fires: int = 0
    retries: int = 0
    replays: int = 0
    restored_records: int = 0
    issue_times_clamped: int = 0
    lateness: Histogram = field(default_factory=lambda: Histogram(LATENESS_MS))
    commit: Histogram = field(default_factory=lambda: Histogram(COMMIT_MS))
    restore: Histogram = field(default_factory=lambda: Histogram(RESTORE_MS))
    tasks: LabelLimiter = field(default_factory=LabelLimiter)
    #: Seconds per transaction phase (:meth:`phases`), summed over the commits.
    phase_seconds: dict[tuple[str], float] = field(
        default_factory=lambda: {(name,): 0.0 for name in TRANSACTION_PHASES}
    )
    #: ``(partition, scheduled ms)`` of the first attempts in the open transaction.
    pending: list[tuple[int, int]] = field(default_factory=list)

    def output(self, partition: int, result: Output) -> None:
        """Count one processor output (runs, status events, dead runs)."""
        for run in result.runs:
            if run.attempt <= 1:
                self.pending.append((partition, run.scheduled_time_ms))
            else:
                self.retries += 1
        runs, jobs = self.runs, self.job_events
        for event in result.status:
            if event.run_id is None:
                key1 = (event.state.value,)
                jobs[key1] = jobs.get(key1, 0) + 1
            else:
                key2 = (self.tasks(event.task or ""), event.state.value)
                runs[key2] = runs.get(key2, 0) + 1
        if result.dead_runs:
            self.dead_letter("dead-run", len(result.dead_runs))

    def refused(self, reason: str) -> None:
        key = (reason,)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def dead_letter(self, kind: str, n: int = 1) -> None:
        key = (kind,)
        self.dead_letters[key] = self.dead_letters.get(key, 0) + n

    def committed(self, now_ms: int, took_s: float) -> None:
        """The transaction committed: its runs are visible now."""
        self.commit.observe(took_s * 1000)
        pending, self.pending = self.pending, []
        self.fires += len(pending)
        observe = self.lateness.observe
        for _, scheduled in pending:
            observe(now_ms - scheduled)

    def phases(self, *seconds: float) -> None:
        """One committed transaction's time, phase by phase (:data:`TRANSACTION_PHASES`)."""
        spent = self.phase_seconds
        for name, s in zip(TRANSACTION_PHASES, seconds, strict=True):
            spent[(name,)] += s

    def discard(self, partitions: Iterable[int] | None = None) -> None:
        """The open transaction's work is forgotten (all of it, or the partitions')."""
        if partitions is None:
            self.pending = []
        else:
            gone = set(partitions)
            self.pending = [x for x in self.pending if x[0] not in gone]


class SchedulerCollector(Collector):
    """Reads a running :class:`~jobwheel.streams.engine.SchedulerEngine` at scrape time."""

    def __init__(self, engine: SchedulerEngine) -> None:
        self.engine = engine
        self.settings = engine.settings

    # --- what the engine knows, read from the server's thread -------------------------------

    def _ends(self) -> dict[int, tuple[int | None, int | None]]:
        """Per held partition, the end offsets of requests and acks as of the last fetch,
        sampled by the engine's loop (twice a second while it turns)."""
        return self.engine.input_ends

    def _snapshot(self) -> list[tuple[int, Any]]:
        """The engine's tasks by partition, read once: the engine's thread replaces a task
        object on every claim and revoke, so a scrape or a probe reads all it reports from
        one snapshot."""
        return sorted(list(self.engine.tasks.items()))

    def partition_report(
        self, tasks: list[tuple[int, Any]]
    ) -> tuple[dict[int, int | None], dict[int, str], list[int]]:
        """``(restoring {partition: records left, None before the changelog is measured},
        stuck {partition: why}, ready)`` of a :meth:`_snapshot`."""
        now = int(time.time() * 1000)
        ends = self._ends()
        restoring: dict[int, int | None] = {}
        stuck: dict[int, str] = {}
        ready: list[int] = []
        for p, task in tasks:
            phase = task.phase.value
            if phase == "restoring":
                progress = task.restore
                measured = progress.reading and progress.end >= 0
                restoring[p] = max(0, progress.end - progress.next) if measured else None
            elif phase == "ready":
                ready.append(p)
                unread = _unread(ends.get(p), task.requests_committed, task.acks_committed)
                why = stuck_reason(
                    task.committed_note,
                    now,
                    unread,
                    stuck_after_ms=self.settings.health_stuck_after_ms,
                )
                if why is not None:
                    stuck[p] = why
        return restoring, stuck, ready

    # --- health -----------------------------------------------------------------------------

    def checks(self) -> dict[str, tuple[Check | None, Check | None]]:
        live = loop_check(
            "scheduler loop",
            lambda: self.engine.turned_at,
            self.settings.health_live_after_ms / 1000,
        )
        return {
            "loop": (live, None),
            "kafka call": (self.engine.watchdog.check_live, None),
            "group": (None, self._ready_group),
            "partitions": (None, self._ready_parts),
        }

    def _ready_group(self) -> tuple[bool, str]:
        """Connected. Not "joined": under the consumer protocol (KIP-848) a member the group
        gives no partition gets no callback at all, so a process with nothing assigned yet
        cannot tell "not yet" from "nothing for me" (it is a hot spare; it is ready)."""
        engine = self.engine
        group = self.settings.scheduler_app_id
        if engine.input is None:
            return False, "connecting to Kafka (the transactional producer is not registered)"
        if not engine.joined:
            return True, f"in the group {group}, no partition assigned so far"
        return True, f"member of the group {group}"

    def _ready_parts(self) -> tuple[bool, str]:
        tasks = self._snapshot()
        restoring, stuck, ready = self.partition_report(tasks)
        problems = [f"partition {p}: {why}" for p, why in sorted(stuck.items())]
        if restoring:
            known = [n for n in restoring.values() if n is not None]
            left = f"{sum(known)} records left" if known else "changelog not measured yet"
            problems.append(f"restoring partitions {sorted(restoring)} ({left})")
        if problems:
            return False, "; ".join(problems)
        standby = sum(1 for _, t in tasks if t.phase.value == "standby")
        if not ready:
            return True, f"owns no partition (standby copies: {standby})"
        return True, f"partitions {ready} ready, none stuck (standby copies: {standby})"

    # --- metrics ----------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Every family, in this order: the work done, the transactions and the clock, the
        partitions (phases, restores, lag, commits)."""
        yield from self._work()
        yield from self._transactions()
        yield from self._partitions()

    def _work(self) -> Iterator[Metric]:
        """Commands, acks, runs and events, refusals and dead letters, fire lateness."""
        stats, meters = self.engine.stats, self.engine.meters
        n = PREFIX
        yield counter(n + "commands_total", "Commands applied.", stats.commands)
        yield counter(n + "acks_total", "Worker acknowledgements applied.", stats.acks)
        yield counter(
            n + "fires_total", "Runs dispatched as first attempts (committed).", meters.fires
        )
        yield counter(n + "retries_total", "Runs dispatched again (attempt > 1).", meters.retries)
        yield counter(
            n + "runs_total",
            "Run events written by the scheduler, by task and state.",
            meters.runs,
            ("task", "state"),
        )
        yield counter(
            n + "job_events_total", "Job events written, by state.", meters.job_events, ("state",)
        )
        yield counter(n + "rejected_total", "Commands and acks refused.", stats.rejected)
        yield counter(
            n + "dead_letters_total",
            "Records written to the dead-letter topic, by kind (as jobwheel dlq list --kind).",
            meters.dead_letters,
            ("kind",),
        )
        yield counter(
            n + "refused_changes_total",
            "Changes refused or undone (each has its event), by reason.",
            meters.refusals,
            ("reason",),
        )
        yield counter(
            n + "replays_total",
            "Commands replayed from the dead letters (jobwheel dlq replay).",
            meters.replays,
        )
        yield histogram(
            n + "fire_lateness_seconds",
            "Commit of a run's first attempt minus its scheduled time.",
            meters.lateness,
            scale=MS,
        )

    def _transactions(self) -> Iterator[Metric]:
        """Transactions and their aborts, resets, commit time, the clock against the broker's."""
        engine, stats, meters = self.engine, self.engine.stats, self.engine.meters
        n = PREFIX
        yield counter(TRANSACTIONS_TOTAL, "Transactions committed.", stats.transactions)
        yield counter(
            n + "transaction_aborts_total",
            "Transactions aborted (their batch is processed again).",
            stats.aborts,
        )
        yield counter(
            n + "resets_total",
            "Fenced or fatal producer errors: a new producer, every partition restored again.",
            stats.resets,
        )
        yield histogram(
            n + "commit_seconds", "One transaction, begin to committed.", meters.commit, scale=MS
        )
        yield counter(
            TRANSACTION_PHASE_SECONDS,
            "Committed transactions' time by phase: open (its work waiting for the commit), "
            "produce, offsets, end (the commit call), state (local state written after it).",
            meters.phase_seconds,
            ["phase"],
        )
        skew = engine.clock.skew_ms()
        yield gauge(
            n + "clock_skew_seconds",
            "This host's clock minus the broker's, as the scheduler reads it (LogAppendTime "
            "of the latest request or ack, advanced by the monotonic clock); NaN before any.",
            math.nan if skew is None else skew / 1000,
        )
        yield counter(
            n + "issue_times_clamped_total",
            "Commands whose issue time was further than JOBWHEEL_SCHEDULER_CLOCK_TOLERANCE_MS "
            "from their record's broker time, and was held to it.",
            meters.issue_times_clamped,
        )
        yield gauge(
            n + "last_commit_timestamp_seconds",
            "Wall clock of the last commit.",
            stats.last_commit_ms / 1000,
        )

    def _partitions(self) -> Iterator[Metric]:
        """Partitions by phase, restores, input lag, commit age, stuck partitions: one
        snapshot of the engine's tasks for all of them."""
        meters = self.engine.meters
        n = PREFIX
        tasks = self._snapshot()
        phases = {("ready",): 0, ("restoring",): 0, ("standby",): 0}
        for _, task in tasks:
            phases[(task.phase.value,)] += 1
        yield gauge(n + "partitions", "Partitions held, by phase.", phases, ("phase",))
        yield gauge(
            n + "partition_phase",
            "1 for each partition held, with its phase.",
            {(str(p), t.phase.value): 1 for p, t in tasks},
            ("partition", "phase"),
        )
        restoring, stuck, ready = self.partition_report(tasks)
        yield gauge(
            n + "restore_remaining_records",
            "Changelog offsets left to restore, per restoring partition.",
            {(str(p),): left for p, left in restoring.items() if left is not None},
            ("partition",),
        )
        yield counter(
            n + "restored_records_total",
            "Changelog records applied by restores.",
            meters.restored_records,
        )
        yield histogram(
            n + "restore_seconds",
            "Restores, assignment to ready, per partition.",
            meters.restore,
            scale=MS,
        )
        yield gauge(
            n + "lag_records",
            "Input records not yet read, per topic and partition.",
            self._lag(tasks),
            ("topic", "partition"),
        )
        now_ms = time.time() * 1000
        yield gauge(
            n + "partition_commit_age_seconds",
            "Seconds since each ready partition last committed (or became ready).",
            {
                (str(p),): (now_ms - task.committed_note.committed_at_ms) / 1000
                for p, task in tasks
                if p in ready and task.committed_note is not None
            },
            ("partition",),
        )
        yield gauge(
            n + "stuck_partitions",
            "Partitions with work waiting and no commit for JOBWHEEL_HEALTH_STUCK_AFTER_MS.",
            len(stuck),
        )

    def _lag(self, tasks: list[tuple[int, Any]]) -> dict[tuple[str, str], float]:
        """Requests and acks records not yet read, by (topic, partition), of the partitions
        owned now whose input ends the loop has sampled. The sample is up to half a second
        old: a partition revoked since is a standby copy here (no input positions) while the
        sample still names it."""
        lag: dict[tuple[str, str], float] = {}
        ends = self._ends()
        t = self.settings.topics
        for p, task in tasks:
            if p not in ends or task.phase.value == "standby":
                continue
            requests = task.requests_next
            acks = task.acks_next if task.acks_next is not None else task.acks_committed
            if requests is None:
                requests = task.requests_committed
            end_requests, end_acks = ends[p]
            if end_requests is not None:
                lag[(t.requests, str(p))] = max(0, end_requests - (requests or 0))
            if end_acks is not None and acks is not None:
                lag[(t.acks, str(p))] = max(0, end_acks - acks)
        return lag


def _unread(
    ends: tuple[int | None, int | None] | None,
    requests_committed: int | None,
    acks_committed: int | None,
) -> int:
    """Input records past the partition's committed offsets, counted as ``jobwheel health``
    counts them from the group's offsets: requests never committed are all unread; acks never
    committed are not counted (the scheduler starts reading them at their end)."""
    if ends is None:
        return 0
    end_requests, end_acks = ends
    unread = 0
    if end_requests is not None:
        unread += max(0, end_requests - (requests_committed or 0))
    if end_acks is not None and acks_committed is not None:
        unread += max(0, end_acks - acks_committed)
    return unread
