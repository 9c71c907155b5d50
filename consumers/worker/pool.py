"""The worker pool: consume runs, execute them with bounded concurrency, acknowledge with status
events on the acks topic, commit offsets of finished work only.

Offsets and at-least-once
-------------------------
A committed offset is a promise that every run before it is finished. The pool keeps that
promise with manual commits of a per-partition *contiguous watermark*
(:class:`~jobwheel.consumers.worker.tracking.OffsetTracker`): a run's offset counts as done only
when the
run reached a terminal state **and its status event was acknowledged by the broker** (SUCCEEDED,
FAILED, STALE; a bad record counts as done once logged). The broker's acknowledgement marks the
offset done right in the producer's delivery report, so that rule costs no round trip through
the event loop. The watermark is the first offset still pending, so a long run holds back
commits of its partition while shorter runs behind it finish. Watermarks that moved are
committed every ``JOBWHEEL_WORKER_COMMIT_INTERVAL_MS`` (100 ms).

Consequences:

* A crash (SIGKILL, OOM, lost node) loses nothing: every run without a delivered terminal
  event is re-delivered to the partition's next owner. Runs finished within the last commit
  interval are re-delivered too (at-least-once); event ids are deterministic
  (``run_id:attempt:STATE``) so readers dedupe.
* Why not commit on fetch (at-most-once) or after execution but before the event? The scheduler
  learns the outcome only from the event; an offset committed before the event is delivered can
  lose the run for good if the process dies in between.
* On revoke (a rebalance moves a partition away) the watermark of what is done is committed
  synchronously and the partition is dropped: nothing beyond done work is ever committed, and
  nothing is committed for a partition this member no longer owns. Runs of that partition still
  executing finish and emit their events; fetched runs not started yet are left to the new
  owner.
* The scheduler's visibility timeout is the second safety net: a run whose worker is gone
  stops heartbeating and is re-dispatched with attempt + 1, whether or not any offset moves.

Events of a run
---------------
A run that finishes within ``JOBWHEEL_WORKER_STARTED_EVENT_MS`` (100 ms) sends one record, its
SUCCEEDED or FAILED, carrying ``started_ms``; a longer one sends STARTED when that time has
passed (stamped with its real start), HEARTBEATs every third of its visibility timeout, then
its verdict. All of a run's records are produced from the event loop in that order, so none
overtakes another.

Duplicates and stale attempts
-----------------------------
* The same ``(run_id, attempt)`` delivered again while it is waiting, running, or finished but
  not yet acknowledged is not executed twice; its offset is completed with that execution.
* An attempt lower than the latest one seen for the run, or a fencing token lower than the
  highest seen for the run (bounded LRU), is dropped with a STALE event: the scheduler has
  moved on. Both checks are per run, so a forged or corrupt record cannot stop other jobs.

Concurrency and shutdown
------------------------
At most ``concurrency`` runs execute at once. Async tasks run as one asyncio task each on the
pool's event loop; sync tasks run in a thread pool of the same size and report back in batches
(one loop wake-up for however many finished meanwhile). When the local backlog is full the pool
pauses its partitions but keeps polling, so long runs never make it miss
``max.poll.interval.ms`` and drop out of the group. Scale out by starting more processes in the
same consumer group.

``stop()`` (SIGTERM/SIGINT) stops fetching, waits up to the grace period for running runs, then
hands the rest back with FAILED ``retry_delay_ms=0`` reason "worker shutdown" (the scheduler
re-dispatches at once instead of waiting out the visibility timeout), commits and closes. A
second ``stop()`` cuts the grace period short.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import os
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jobwheel.clock import Clock, SystemClock
from jobwheel.consumers.worker.context import RunContext, reset_context, set_context
from jobwheel.consumers.worker.executor import Executor, Outcome, Prepared, format_error
from jobwheel.consumers.worker.kafka import Record, RunsConsumer, StatusProducer
from jobwheel.consumers.worker.metrics import WorkerMeters
from jobwheel.consumers.worker.middleware import Middleware, default_middleware
from jobwheel.consumers.worker.registry import TaskRegistry, default_registry
from jobwheel.consumers.worker.tracking import LatestAttempts, OffsetTracker
from jobwheel.errors import BrokerError, DeliveryError, SchemaDecodeError
from jobwheel.retry import Backoff
from jobwheel.schemas.models import HANDBACK_REASON, Run, State, StatusEvent
from jobwheel.schemas.partitioning import key_for
from jobwheel.schemas.topics import DISPATCHED_HEADER, STATE_HEADER
from jobwheel.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

POLL_TIMEOUT_S = 0.1
FETCH_BATCH = 500
SWEEP_INTERVAL_S = 0.05
FULL_WAIT_S = 1.0
HAND_BACK_TIMEOUT_S = 10.0
#: How often the consumer thread samples its partitions' lag for the metrics.
LAG_SAMPLE_S = 0.5
_MAX_REDELIVERY_DELAY_S = 5.0

#: An encoded acks record: topic, key, value, headers.
_AckRecord = tuple[str, bytes, bytes, list[tuple[str, bytes]]]


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(eq=False, slots=True)
class _Execution:
    """One (run_id, attempt): waiting, executing or acknowledging, and every offset that
    delivered it. ``offsets`` and ``acked`` are shared with the delivery thread (pool lock)."""

    run: Run
    offsets: list[tuple[OffsetTracker, int]]
    started: float = 0.0  # monotonic
    started_ms: int | None = None  # wall clock; None: never started (could not)
    started_sent: bool = False
    prepared: Prepared | None = None
    task: asyncio.Task[None] | None = None  # an async task's run
    thread: concurrent.futures.Future[None] | None = None  # a sync task's run
    deadline: float | None = None  # monotonic; sync tasks' time limit (async: asyncio.timeout)
    beat_interval: float = 0.0
    next_beat: float = 0.0
    heartbeats: int = 0
    last_heartbeat_ms: int = 0
    holds_slot: bool = False
    handing_back: bool = False
    outcome: Outcome | None = None
    acked: bool = False
    #: Sending its verdict again after a failed delivery: 0.1 s, doubling up to the cap.
    redelivery: Backoff = field(
        default_factory=lambda: Backoff(start_s=0.1, max_s=_MAX_REDELIVERY_DELAY_S)
    )

    @property
    def key(self) -> tuple[str, int]:
        return (self.run.run_id, self.run.attempt)


class WorkerPool:
    """Consumes the runs topic as a member of ``settings.worker_group`` until :meth:`stop`.

    :param concurrency: runs executing at once (default ``settings.worker_concurrency``).
    :param grace_ms: shutdown grace (default ``settings.worker_shutdown_grace_ms``).
    :param middleware: hooks around processing (default: structured logging).
    """

    def __init__(
        self,
        settings: Settings,
        registry: TaskRegistry | None = None,
        *,
        concurrency: int | None = None,
        grace_ms: int | None = None,
        middleware: Sequence[Middleware] | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
        latest_attempts_capacity: int = 100_000,
        rng: random.Random | None = None,
    ) -> None:
        from jobwheel.schemas.codec import Codec

        self.settings = settings
        self.registry = registry if registry is not None else default_registry
        self.concurrency = concurrency or settings.worker_concurrency
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        grace = grace_ms if grace_ms is not None else settings.worker_shutdown_grace_ms
        self.grace_s = grace / 1000
        self.worker_id = worker_id or default_worker_id()
        self.middleware = list(middleware) if middleware is not None else default_middleware()
        self._clock = clock or SystemClock()
        self._codec = Codec(settings.schema_registry_url)
        self._runs_topic = settings.topics.runs
        self._acks_topic = settings.topics.acks
        self._started_event_s = max(0, settings.worker_started_event_ms) / 1000
        self._commit_interval_s = max(0, settings.worker_commit_interval_ms) / 1000
        self._task_threads = concurrent.futures.ThreadPoolExecutor(
            self.concurrency, thread_name_prefix="jobwheel-task"
        )
        self._executor = Executor(self.registry, self._task_threads, rng=rng)
        self._kafka_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="jobwheel-consumer"
        )
        # Shared by the consumer thread, the delivery thread and the loop: trackers.
        self._lock = threading.Lock()
        self._trackers: dict[int, OffsetTracker] = {}
        self._paused = False
        self._last_commit = 0.0
        # Handed to the loop by other threads (deque appends and pops are atomic).
        self._acked: deque[_Execution] = deque()  # verdict delivered: reap (hooks, forget)
        self._completions: deque[tuple[_Execution, Outcome]] = deque()  # sync tasks returned
        self._wake_pending = False
        # Loop state.
        self._latest = LatestAttempts(latest_attempts_capacity)
        self._inflight: dict[tuple[str, int], _Execution] = {}
        self._backlog: deque[_Execution] = deque()  # fetched, not started
        self._active: set[_Execution] = set()  # executing
        self._running = 0  # executions holding a concurrency slot
        self._high_water = max(20 * self.concurrency, 1_000)
        self._stop_requested = asyncio.Event()
        self._hurry = asyncio.Event()
        self._idle = asyncio.Event()
        self._room = asyncio.Event()  # set: the backlog has drained to half its high water
        self._draining = False
        self._closing = False
        self._sweeper: asyncio.TimerHandle | None = None
        self._consumer: RunsConsumer | None = None
        self._producer: StatusProducer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # For metrics and health (read by the metrics server's thread, never waited on):
        # verdicts counted on the loop, the loop's last turn, whether the group has assigned
        # anything yet, and the lag per assigned partition sampled by the consumer thread.
        self.meters = WorkerMeters()
        self.turned_at = time.monotonic()
        self.joined = False
        self.lag: dict[int, int] = {}
        self._lag_at = 0.0

    # --- public ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Graceful stop; a second call skips the rest of the grace period. Loop thread only."""
        if self._stop_requested.is_set():
            self._hurry.set()
        self._stop_requested.set()

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    @property
    def partitions(self) -> list[int]:
        """The runs partitions assigned to this worker now."""
        return sorted(list(self._trackers))  # list(): one atomic copy of the keys

    @property
    def inflight(self) -> int:
        """Runs executing now."""
        return len(self._active)

    @property
    def waiting(self) -> int:
        """Runs fetched and waiting for a free slot."""
        return len(self._backlog)

    @property
    def busy_threads(self) -> int:
        """Sync task threads still running (they outlive a cancelled or timed-out run)."""
        return self._executor.busy_threads

    async def run(self) -> None:
        """Consume and execute until :meth:`stop`; raises :class:`BrokerError` on a fatal error."""
        self._loop = asyncio.get_running_loop()
        self._producer = StatusProducer(self.settings, **{"client.id": "jobwheel-worker"})
        self._consumer = RunsConsumer(
            self.settings, self._runs_topic, **{"client.id": "jobwheel-worker"}
        )
        await self._in_consumer_thread(
            self._consumer.subscribe, self._on_assign, self._on_revoke, self._on_lost
        )
        log.info(
            "worker started",
            extra={
                "worker": self.worker_id,
                "topic": self._runs_topic,
                "group": self.settings.worker_group,
                "concurrency": self.concurrency,
                "tasks": self.registry.describe(),
            },
        )
        self._sweeper = self._loop.call_later(SWEEP_INTERVAL_S, self._sweep)
        fetch = asyncio.create_task(self._fetch_loop(), name="jobwheel-fetch")
        stop = asyncio.create_task(self._stop_requested.wait())
        await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
        fatal = _task_error(fetch)
        try:
            await self._shutdown()
        finally:
            self._closing = True
            stop.cancel()
            if self._sweeper is not None:
                self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, BrokerError):
                await fetch
            await self._close()
        if fatal is not None:
            raise fatal

    # --- consumer thread ------------------------------------------------------------------

    async def _in_consumer_thread(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._kafka_thread, lambda: fn(*args))

    def _on_assign(self, partitions: list[int]) -> None:
        self.joined = True
        with self._lock:
            for p in partitions:
                self._trackers[p] = OffsetTracker(p)
        if partitions:  # cooperative rebalances also report empty increments
            log.info("partitions assigned", extra={"partitions": sorted(partitions)})

    def _on_revoke(self, partitions: list[int]) -> None:
        self._commit(asynchronous=False, only=set(partitions), final=True)
        self._drop(partitions)
        if partitions:
            log.info("partitions revoked", extra={"partitions": sorted(partitions)})

    def _on_lost(self, partitions: list[int]) -> None:
        self._drop(partitions)  # another member may own them already: commit nothing
        if partitions:
            log.warning("partitions lost", extra={"partitions": sorted(partitions)})

    def _drop(self, partitions: list[int]) -> None:
        with self._lock:
            for p in partitions:
                tracker = self._trackers.pop(p, None)
                if tracker is not None:
                    tracker.revoked = True

    def _commit(
        self, *, asynchronous: bool, only: set[int] | None = None, final: bool = False
    ) -> None:
        """Commit watermarks that moved (``final``: every known watermark, synchronously)."""
        assert self._consumer is not None
        with self._lock:
            offsets: dict[int, int] = {}
            for p, tracker in self._trackers.items():
                if only is not None and p not in only:
                    continue
                offset = tracker.watermark if final and not tracker.revoked else tracker.to_commit()
                if offset is not None:
                    offsets[p] = offset
        if not offsets:
            return
        try:
            self._consumer.commit(offsets, asynchronous=asynchronous)
        except BrokerError as exc:
            log.warning("offset commit failed", extra={"offsets": offsets, "error": str(exc)})
            return
        with self._lock:
            for p, offset in offsets.items():
                tracker = self._trackers.get(p)
                if tracker is not None:
                    tracker.committed(offset)

    def _poll_step(self, pause: bool) -> list[tuple[OffsetTracker, Record]]:
        """One consumer-thread iteration: flow control, periodic commit, fetch."""
        assert self._consumer is not None
        if pause:
            self._consumer.pause(self._consumer.assignment())
            self._paused = True
        elif self._paused:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False
        now = time.monotonic()
        if now - self._last_commit >= self._commit_interval_s:
            self._last_commit = now
            self._commit(asynchronous=True)
        if now - self._lag_at >= LAG_SAMPLE_S:
            self._lag_at = now
            self.lag = self._consumer.lag()
        # Take what is there without waiting; with nothing there, wait for the first record
        # only (a batch call would hold early records back until the batch fills or times
        # out), no longer than until the next commit is due.
        records = self._consumer.consume(FETCH_BATCH, 0)
        if not records:
            timeout = min(POLL_TIMEOUT_S, max(0.005, self._commit_interval_s))
            records = self._consumer.consume(1, timeout)
            if records:
                records += self._consumer.consume(FETCH_BATCH - 1, 0)
        out: list[tuple[OffsetTracker, Record]] = []
        with self._lock:
            for record in records:
                tracker = self._trackers.get(record.partition)
                if tracker is None:
                    continue  # not ours (any more): the owner gets it
                try:
                    tracker.add(record.offset)
                except ValueError:
                    log.debug("re-fetched record ignored", extra={"offset": record.offset})
                    continue
                out.append((tracker, record))
        return out

    async def _fetch_loop(self) -> None:
        """Poll until closing, in batches, handing every record to :meth:`_accept`.

        Flow control: with the local backlog at its high water mark the loop stops taking
        records and waits for it to drain to half. A short wait leaves the client's prefetched
        records in place (pausing the partitions would drop them and cost a fetch round trip on
        resume, which capped a worker at about 1,200 quick runs per second). When the backlog
        stays full (long runs), the partitions are paused and polling goes on, so group
        membership and rebalance callbacks keep working; the same while draining.
        """
        while not self._closing:
            pause = self._draining
            if not pause and len(self._backlog) >= self._high_water:
                self._room.clear()
                try:
                    await asyncio.wait_for(self._room.wait(), FULL_WAIT_S)
                    continue
                except TimeoutError:
                    pause = True
            items = await self._in_consumer_thread(self._poll_step, pause)
            self._reap()
            if self._draining:
                continue  # not started: left uncommitted for the partition's next owner
            for tracker, record in items:
                self._accept(tracker, record)
            self._start_ready()

    # --- admission ------------------------------------------------------------------------

    def _decode(self, tracker: OffsetTracker, record: Record) -> Run | None:
        """A record that is not a Run is logged and skipped (and committed past): retrying
        bytes no reader understands would block the partition forever."""
        try:
            if record.value is None:
                raise SchemaDecodeError("the record has no value (a tombstone?)")
            value = self._codec.decode(record.value)
            if not isinstance(value, Run):
                raise SchemaDecodeError(f"expected a Run, got a {type(value).__name__}")
        except SchemaDecodeError as exc:
            log.error(
                "undecodable run record skipped",
                extra={
                    "topic": self._runs_topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "error": str(exc),
                },
            )
            self._done([(tracker, record.offset)])
            return None
        return value

    def _accept(self, tracker: OffsetTracker, record: Record) -> None:
        """Decide before executing: stale (emit STALE), duplicate (join the execution of the same
        attempt), else queue it."""
        run = self._decode(tracker, record)
        if run is None or tracker.revoked:
            return
        stale = self._latest.observe(run.run_id, run.attempt, run.fencing_token)
        if stale is not None:
            self._stale(run, [(tracker, record.offset)], stale)
            return
        known = self._inflight.get((run.run_id, run.attempt))
        if known is not None:
            with self._lock:
                if known.acked:  # finished and acknowledged: this copy is done as well
                    tracker.mark_done(record.offset)
                else:
                    known.offsets.append((tracker, record.offset))
            self._hook("after_skip", run, None, "duplicate delivery of a known attempt")
            return
        execution = _Execution(run, [(tracker, record.offset)])
        self._inflight[execution.key] = execution
        self._backlog.append(execution)

    def _start_ready(self) -> None:
        """Start waiting runs while slots are free (after a fetch and whenever a run ends)."""
        while self._running < self.concurrency and self._backlog and not self._draining:
            ex = self._backlog.popleft()
            if not self._room.is_set() and len(self._backlog) <= self._high_water // 2:
                self._room.set()
            if all(tracker.revoked for tracker, _ in ex.offsets):
                self._inflight.pop(ex.key, None)  # the partition moved: its new owner runs it
                continue
            newer = self._latest.newer_attempt(ex.run.run_id, ex.run.attempt)
            if newer is not None:
                self._inflight.pop(ex.key, None)
                reason = (
                    f"stale attempt: {ex.run.attempt} < {newer}, a newer attempt of this run "
                    "arrived while it waited"
                )
                self._stale(ex.run, ex.offsets, reason)
                continue
            self._start(ex)

    # --- one run --------------------------------------------------------------------------

    def _start(self, ex: _Execution) -> None:
        run = ex.run
        ex.started = time.monotonic()
        ex.started_ms = self._clock.now_ms()
        prepared = self._executor.prepare(run, ex.started)
        if isinstance(prepared, Outcome):  # unknown task, bad arguments: it never starts
            ex.started_ms = None
            self._finish(ex, prepared)
            return
        loop = self._loop
        assert loop is not None
        self._running += 1
        ex.holds_slot = True
        ex.prepared = prepared
        ex.beat_interval = max(0.05, run.visibility_timeout_ms / 3000)
        ex.next_beat = ex.started + ex.beat_interval
        self._active.add(ex)
        self._hook("before_process", run)
        if self._started_event_s == 0:
            self._send_started(ex)
        if prepared.spec.is_async:
            ex.task = loop.create_task(self._run_async(ex, prepared))
            return
        if prepared.timeout_ms:
            ex.deadline = ex.started + prepared.timeout_ms / 1000
        token = set_context(RunContext(run=run, heartbeat=functools.partial(self._beat, ex)))
        try:
            ctx = contextvars.copy_context()
        finally:
            reset_context(token)
        ex.thread = self._task_threads.submit(ctx.run, self._call_sync, ex, prepared)
        self._executor.track_thread(ex.thread)

    async def _run_async(self, ex: _Execution, prepared: Prepared) -> None:
        try:
            outcome = await self._executor.run_async(
                ex.run, prepared, functools.partial(self._beat, ex), ex.started
            )
        except asyncio.CancelledError:
            if not ex.handing_back:
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            outcome = self._hand_back_outcome(ex)
        self._finish(ex, outcome)
        self._start_ready()

    def _call_sync(self, ex: _Execution, prepared: Prepared) -> None:
        """In a task thread: call the function, hand the outcome to the loop."""
        try:
            outcome = self._executor.call_sync(ex.run, prepared, ex.started)
        except BaseException as exc:  # whatever escapes the executor is the run's failure
            outcome = Outcome(State.FAILED, 0, error=format_error(exc), reason="worker error")
        self._completions.append((ex, outcome))
        if not self._wake_pending:
            self._wake_pending = True
            self._threadsafe(self._drain_completions)

    def _drain_completions(self) -> None:
        self._wake_pending = False
        while self._completions:
            ex, outcome = self._completions.popleft()
            if ex.outcome is None:
                self._finish(ex, outcome)
            elif ex.holds_slot:  # timed out earlier; its thread has now returned
                ex.holds_slot = False
                self._running -= 1
        self._start_ready()

    def _finish(self, ex: _Execution, outcome: Outcome) -> None:
        """The run's verdict: free its slot (a timed-out sync task keeps it until its thread
        returns) and send the terminal event; the broker's acknowledgement completes it.
        Callers start the next runs (not here: a row of runs that cannot start would recurse)."""
        if ex.outcome is not None:
            return
        ex.outcome = outcome
        self._active.discard(ex)
        self.meters.verdict(
            ex.run.task,
            outcome.state.value,
            outcome.duration_ms if ex.started_ms is not None else None,
        )
        if outcome.reason == HANDBACK_REASON:
            self.meters.handed_back += 1
        if ex.holds_slot and (outcome.lingering is None or self._draining):
            ex.holds_slot = False
            self._running -= 1
        started_ms = ex.started_ms if not ex.started_sent else None
        event = self._event(
            ex.run,
            outcome.state,
            duration_ms=outcome.duration_ms,
            result_json=outcome.result_json,
            error=outcome.error,
            reason=outcome.reason,
            retry_delay_ms=outcome.retry_delay_ms,
            started_ms=started_ms,
        )
        self._send_verdict(ex, self._record(event, ex.run))
        if self._draining and not self._active:
            self._idle.set()

    def _send_verdict(self, ex: _Execution, record: _AckRecord) -> None:
        assert self._producer is not None
        try:
            queued = self._producer.produce(
                *record, on_delivery=functools.partial(self._verdict_delivered, ex, record)
            )
        except BrokerError as exc:
            queued = False
            log.warning(
                "status event not queued; retrying",
                extra={"run_id": ex.run.run_id, "error": str(exc)},
            )
        if not queued:  # local queue full (or refused): try again shortly
            self._retry_later(ex, record)

    def _verdict_delivered(
        self, ex: _Execution, record: _AckRecord, error: DeliveryError | None
    ) -> None:
        """Delivery thread: the broker has the verdict, so the run's offsets are done."""
        if error is None:
            with self._lock:
                ex.acked = True
                for tracker, offset in ex.offsets:
                    tracker.mark_done(offset)
            self._acked.append(ex)
            return
        log.warning(
            "status event not delivered; retrying",
            extra={"run_id": ex.run.run_id, "attempt": ex.run.attempt, "error": str(error)},
        )
        self._threadsafe(self._retry_later, ex, record)

    def _retry_later(self, ex: _Execution, record: _AckRecord) -> None:
        """Send until acknowledged: the offset commit waits for the verdict, so giving up would
        stall the partition. Gives up only when the pool is closing (the record is then
        re-delivered to the next owner)."""
        if self._closing or self._loop is None:
            return
        self._loop.call_later(ex.redelivery.failed(), self._send_verdict, ex, record)

    def _reap(self) -> None:
        """Forget acknowledged executions and tell the middleware (after the broker ack)."""
        while self._acked:
            ex = self._acked.popleft()
            if self._inflight.get(ex.key) is ex:
                del self._inflight[ex.key]
            if ex.outcome is not None and ex.outcome.state is not State.STALE:
                self._hook("after_process", ex.run, ex.outcome)

    def _hand_back_outcome(self, ex: _Execution) -> Outcome:
        return Outcome(
            State.FAILED,
            int((time.monotonic() - ex.started) * 1000),
            error="WorkerShutdown: the worker stopped before the run finished",
            reason=HANDBACK_REASON,
            retry_delay_ms=0,
        )

    def _stale(self, run: Run, offsets: list[tuple[OffsetTracker, int]], reason: str) -> None:
        """A STALE event; the offsets are done once the broker has it."""
        assert self._producer is not None
        record = self._record(self._event(run, State.STALE, reason=reason), run)
        self.meters.verdict(run.task, State.STALE.value)
        ex = _Execution(run, offsets)  # only for the delivery bookkeeping
        ex.outcome = Outcome(State.STALE, 0, reason=reason)
        self._send_verdict(ex, record)
        self._hook("after_skip", run, State.STALE, reason)

    def _done(self, offsets: list[tuple[OffsetTracker, int]]) -> None:
        with self._lock:
            for tracker, offset in offsets:
                tracker.mark_done(offset)

    def _threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)

    # --- STARTED, heartbeats, time limits -------------------------------------------------

    def _sweep(self) -> None:
        """Every SWEEP_INTERVAL_S: STARTED for runs past the quick-run time, heartbeats every
        third of the visibility timeout, sync tasks over their time limit. One timer for all
        runs instead of timers per run."""
        now = time.monotonic()
        self.turned_at = now
        for ex in list(self._active):
            if ex.outcome is not None:
                continue
            if not ex.started_sent and now - ex.started >= self._started_event_s:
                self._send_started(ex)
            if now >= ex.next_beat:
                ex.next_beat = now + ex.beat_interval
                self._heartbeat(ex, explicit=False)
            if ex.deadline is not None and now >= ex.deadline and ex.prepared is not None:
                duration_ms = int((now - ex.started) * 1000)
                self._finish(
                    ex, self._executor.timed_out(ex.run, ex.prepared, duration_ms, ex.thread)
                )
        if not self._closing and self._loop is not None:
            self._sweeper = self._loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    def _send_started(self, ex: _Execution) -> None:
        ex.started_sent = True
        now = self._clock.now_ms()
        event = self._event(
            ex.run,
            State.STARTED,
            now_ms=ex.started_ms,  # when it started, not when this record is sent
            deadline_ms=now + ex.run.visibility_timeout_ms,
        )
        self._send_info(ex, event)

    def _beat(self, ex: _Execution) -> None:
        """``heartbeat()`` called by task code, from a task thread or the loop."""
        self._threadsafe(self._heartbeat, ex, True)

    def _heartbeat(self, ex: _Execution, explicit: bool) -> None:
        if ex.outcome is not None or self._closing:
            return
        now = self._clock.now_ms()
        # Explicit calls are rate limited: a task calling heartbeat() in a loop must not flood
        # the acks topic; a tenth of the visibility timeout keeps deadlines comfortably fresh.
        if explicit and now - ex.last_heartbeat_ms < max(100, ex.run.visibility_timeout_ms // 10):
            return
        if not ex.started_sent:
            self._send_started(ex)  # a heartbeat never comes before its STARTED
        ex.heartbeats += 1
        ex.last_heartbeat_ms = now
        event = self._event(
            ex.run,
            State.HEARTBEAT,
            suffix=f":{ex.heartbeats}",
            now_ms=now,  # the deadline is "this heartbeat + the visibility timeout"
            deadline_ms=now + ex.run.visibility_timeout_ms,
        )
        self._send_info(ex, event)

    def _send_info(self, ex: _Execution, event: StatusEvent) -> None:
        """STARTED and HEARTBEAT: sent once, never waited for (a lost one costs nothing the
        next heartbeat or the verdict does not make up for). Produced on the loop, before the
        run's verdict, so neither overtakes it."""
        assert self._producer is not None
        state = event.state.value
        run_id = ex.run.run_id

        def report(error: DeliveryError | None) -> None:
            if error is not None:
                log.warning(
                    "status event not delivered",
                    extra={"run_id": run_id, "state": state, "error": str(error)},
                )

        try:
            queued = self._producer.produce(*self._record(event, ex.run), on_delivery=report)
        except BrokerError as exc:
            log.warning(
                "status event not sent", extra={"run_id": run_id, "state": state, "error": str(exc)}
            )
            return
        if not queued:
            log.warning(
                "status event dropped: producer queue full",
                extra={"run_id": run_id, "state": state},
            )

    # --- status events --------------------------------------------------------------------

    def _event(
        self,
        run: Run,
        state: State,
        *,
        suffix: str = "",
        now_ms: int | None = None,
        **fields: Any,
    ) -> StatusEvent:
        return StatusEvent(
            event_id=f"{run.run_id}:{run.attempt}:{state.value}{suffix}",
            job_id=run.job_id,
            state=state,
            event_time_ms=self._clock.now_ms() if now_ms is None else now_ms,
            source="worker",
            run_id=run.run_id,
            seq=run.seq,
            attempt=run.attempt,
            task=run.task,
            scheduled_time_ms=run.scheduled_time_ms,
            worker=self.worker_id,
            **fields,
        )

    def _record(self, event: StatusEvent, run: Run) -> _AckRecord:
        """The acks record of an event: keyed by job id (so it lands in the job's partition),
        its state in a header (so the scheduler skips what it does not need without decoding
        it), and when its run was dispatched (how far this partition's worker has got)."""
        headers = [
            (STATE_HEADER, event.state.value.encode()),
            (DISPATCHED_HEADER, str(run.dispatched_at_ms).encode()),
        ]
        return self._acks_topic, key_for(event.job_id), self._codec.encode(event), headers

    def _hook(self, name: str, *args: Any) -> None:
        for mw in self.middleware:
            try:
                getattr(mw, name)(*args)
            except Exception:
                log.exception("middleware hook failed", extra={"hook": name})

    # --- shutdown -------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        self._draining = True
        log.info(
            "worker stopping",
            extra={
                "running": len(self._active),
                "waiting": len(self._backlog),
                "grace_s": self.grace_s,
            },
        )
        if self._active:
            self._idle.clear()
            idle = asyncio.ensure_future(self._idle.wait())
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                {idle, hurry}, timeout=self.grace_s, return_when=asyncio.FIRST_COMPLETED
            )
            idle.cancel()
            hurry.cancel()
        # Hand back what is still executing: FAILED with retry 0, so it is re-dispatched at once.
        tasks: list[asyncio.Task[None]] = []
        for ex in list(self._active):
            log.warning(
                "run handed back",
                extra={"run_id": ex.run.run_id, "attempt": ex.run.attempt, "reason": "shutdown"},
            )
            if ex.task is not None and not ex.task.done():
                ex.handing_back = True
                ex.task.cancel()
                tasks.append(ex.task)
            else:  # a sync task: its thread cannot be stopped, the run is given up here
                self._finish(ex, self._hand_back_outcome(ex))
        if tasks:
            _done, still = await asyncio.wait(tasks, timeout=HAND_BACK_TIMEOUT_S)
            for task in still:
                task.cancel()
        # Wait for the verdicts' acknowledgements, which complete the offsets committed last.
        if self._producer is not None:
            producer = self._producer
            await asyncio.get_running_loop().run_in_executor(
                None, producer.flush, HAND_BACK_TIMEOUT_S
            )
        self._reap()

    async def _close(self) -> None:
        if self._consumer is not None:
            consumer = self._consumer
            with contextlib.suppress(Exception):
                await self._in_consumer_thread(
                    functools.partial(self._commit, asynchronous=False, final=True)
                )
            with contextlib.suppress(Exception):
                await self._in_consumer_thread(consumer.close)
        if self._producer is not None:
            producer = self._producer
            remaining = await asyncio.get_running_loop().run_in_executor(None, producer.close, 5.0)
            if remaining:
                log.warning("status events not delivered at exit", extra={"count": remaining})
        self._kafka_thread.shutdown(wait=True)
        self._task_threads.shutdown(wait=False, cancel_futures=True)
        log.info("worker stopped", extra={"worker": self.worker_id})


def _task_error(task: asyncio.Task[Any]) -> BaseException | None:
    if not task.done() or task.cancelled():
        return None
    return task.exception()
