"""The worker pool: consume runs, execute them with bounded concurrency, acknowledge with status
events on the acks topic, commit offsets of finished work only.

Offsets and at-least-once
-------------------------
A committed offset is a promise that every run before it is finished. The pool keeps that
promise with manual commits of a per-partition *contiguous watermark*
(:class:`~consumers.worker.tracking.OffsetTracker`): a run's offset counts as done only when the
run reached a terminal state **and its status event was acknowledged by the broker** (SUCCEEDED,
FAILED, STALE; a bad record counts as done once logged). The watermark is the first offset still
pending, so a long run holds back commits of its partition while shorter runs behind it finish.

Consequences:

* A crash (SIGKILL, OOM, lost node) loses nothing: every run without a delivered terminal
  event is re-delivered to the partition's next owner. Some finished runs may be re-delivered
  too (at-least-once); event ids are deterministic (``run_id:attempt:STATE``) so readers dedupe.
* Why not commit on fetch (at-most-once) or after execution but before the event? The scheduler
  learns the outcome only from the event; an offset committed before the event is delivered can
  lose the run for good if the process dies in between.
* On revoke (a rebalance moves a partition away) the watermark of what is done is committed
  synchronously and the partition is dropped: nothing beyond done work is ever committed, and
  nothing is committed for a partition this member no longer owns. Runs of that partition still
  executing finish and emit their events; the new owner gets their records again (duplicate
  execution is the price of not blocking the rebalance).
* The scheduler's visibility timeout is the second safety net: a run whose worker is gone
  stops heartbeating and is re-dispatched with attempt + 1, whether or not any offset moves.

Duplicates, stale attempts and fencing
--------------------------------------
* The same ``(run_id, attempt)`` delivered again while it is running is not executed twice; its
  offset is completed together with the running execution.
* An attempt lower than the latest one seen for the run (bounded LRU) is dropped with a STALE
  event: the scheduler has already moved on to a newer attempt.
* A fencing token lower than the highest seen for the run's scheduler partition comes from a
  replaced (fenced) owner: dropped with STALE.

Concurrency and shutdown
------------------------
At most ``concurrency`` runs execute at once (an asyncio semaphore; sync tasks in a thread pool of
the same size). When the local backlog is full the pool pauses its partitions but keeps polling,
so long runs never make it miss ``max.poll.interval.ms`` and drop out of the group. Scale out by
starting more processes in the same consumer group.

``stop()`` (SIGTERM/SIGINT) stops fetching, waits up to the grace period for running runs, then
hands the rest back with FAILED ``retry_delay_ms=0`` reason "worker shutdown" (the scheduler
re-dispatches at once instead of waiting out the visibility timeout), commits and closes. A
second ``stop()`` cuts the grace period short.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from consumers.worker.executor import Executor, Outcome
from consumers.worker.kafka import Record, RunsConsumer, StatusProducer
from consumers.worker.middleware import Middleware, default_middleware
from consumers.worker.registry import TaskRegistry, default_registry
from consumers.worker.tracking import FencingTokens, LatestAttempts, OffsetTracker
from jobwheel.clock import Clock, SystemClock
from jobwheel.errors import BrokerError, SchemaDecodeError
from jobwheel.settings import Settings
from schemas.models import HANDBACK_REASON, Run, State, StatusEvent
from schemas.partitioning import key_for
from schemas.topics import STATE_HEADER

log = logging.getLogger(__name__)

T = TypeVar("T")

POLL_TIMEOUT_S = 0.1
COMMIT_INTERVAL_S = 0.2
FETCH_BATCH = 200
HAND_BACK_TIMEOUT_S = 10.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(eq=False)
class _Execution:
    """One (run_id, attempt) being executed and every offset that delivered it."""

    run: Run
    offsets: list[tuple[OffsetTracker, int]]
    started: float = field(default_factory=time.monotonic)
    exec_task: asyncio.Task[Outcome] | None = None
    outcome: Outcome | None = None
    heartbeats: int = 0
    beat: asyncio.TimerHandle | None = None
    last_heartbeat_ms: int = 0


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
        from schemas.codec import Codec

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
        self._task_threads = concurrent.futures.ThreadPoolExecutor(
            self.concurrency, thread_name_prefix="jobwheel-task"
        )
        self._executor = Executor(self.registry, self._task_threads, rng=rng)
        self._kafka_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="jobwheel-consumer"
        )
        # Consumer-thread state, shared with the loop under the lock.
        self._lock = threading.Lock()
        self._trackers: dict[int, OffsetTracker] = {}
        self._paused = False
        self._last_commit = 0.0
        # Loop state.
        self._latest = LatestAttempts(latest_attempts_capacity)
        self._fencing = FencingTokens()
        self._inflight: dict[tuple[str, int], _Execution] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._backlog: asyncio.Queue[tuple[OffsetTracker, Record]] = asyncio.Queue()
        self._high_water = max(20 * self.concurrency, 1_000)  # fetched, not started
        self._slots = asyncio.Semaphore(self.concurrency)
        self._stop_requested = asyncio.Event()
        self._hurry = asyncio.Event()
        self._draining = False
        self._closing = False
        self._consumer: RunsConsumer | None = None
        self._producer: StatusProducer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- public ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Graceful stop; a second call skips the rest of the grace period. Loop thread only."""
        if self._stop_requested.is_set():
            self._hurry.set()
        self._stop_requested.set()

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
        fetch = asyncio.create_task(self._fetch_loop(), name="jobwheel-fetch")
        dispatch = asyncio.create_task(self._dispatch_loop(), name="jobwheel-dispatch")
        stop = asyncio.create_task(self._stop_requested.wait())
        await asyncio.wait({fetch, dispatch, stop}, return_when=asyncio.FIRST_COMPLETED)
        fatal = _task_error(fetch) or _task_error(dispatch)
        try:
            await self._shutdown(dispatch)
        finally:
            self._closing = True
            stop.cancel()
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
        if now - self._last_commit >= COMMIT_INTERVAL_S:
            self._last_commit = now
            self._commit(asynchronous=True)
        records = self._consumer.consume(FETCH_BATCH, POLL_TIMEOUT_S)
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
        """Poll until closing. While draining, partitions stay paused but polling goes on, so
        the group membership and the rebalance callbacks keep working."""
        pause = False
        while not self._closing:
            # Hysteresis: every pause/resume cycle costs a fetch round trip, so pause at the high
            # water mark and resume only once the backlog is down to half of it.
            size = self._backlog.qsize()
            if size >= self._high_water:
                pause = True
            elif size <= self._high_water // 2:
                pause = False
            pause = pause or self._draining
            items = await self._in_consumer_thread(self._poll_step, pause)
            for item in items:
                self._backlog.put_nowait(item)

    # --- dispatch -------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            tracker, record = await self._backlog.get()
            run = self._decode(tracker, record)
            if run is None or tracker.revoked:
                continue
            if self._admit(run, tracker, record.offset):
                continue
            await self._slots.acquire()
            execution = _Execution(run, [(tracker, record.offset)])
            self._inflight[(run.run_id, run.attempt)] = execution
            self._spawn(self._process(execution), f"run {run.run_id}#{run.attempt}")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
            self._done(tracker, record.offset)
            return None
        return value

    def _admit(self, run: Run, tracker: OffsetTracker, offset: int) -> bool:
        """Decide before executing: fenced or stale (emit STALE), duplicate (join the running
        execution). Returns True when the run is handled without executing."""
        newer_token = self._fencing.observe(run.partition, run.fencing_token)
        if newer_token is not None:
            reason = f"fenced: token {run.fencing_token} < {newer_token}"
            self._spawn(self._stale(run, tracker, offset, reason), f"stale {run.run_id}")
            return True
        newer_attempt = self._latest.observe(run.run_id, run.attempt)
        if newer_attempt is not None:
            reason = (
                f"stale attempt: {run.attempt} < {newer_attempt}, a newer attempt of this run "
                "was already dispatched"
            )
            self._spawn(self._stale(run, tracker, offset, reason), f"stale {run.run_id}")
            return True
        running = self._inflight.get((run.run_id, run.attempt))
        if running is not None:
            running.offsets.append((tracker, offset))
            self._hook("after_skip", run, None, "duplicate delivery while the attempt is running")
            return True
        return False

    # --- one run --------------------------------------------------------------------------

    async def _process(self, ex: _Execution) -> None:
        """Execute one attempt and acknowledge it.

        The concurrency slot covers execution only (plus a timed-out sync task's thread until it
        really returns), not the wait for the broker's acknowledgement of the terminal event:
        that wait is cheap bookkeeping, and holding slots through it capped a fast task at
        ``concurrency / round-trip`` runs per second.
        """
        run = ex.run
        released = False

        def release(_: object = None) -> None:
            nonlocal released
            if not released:
                released = True
                self._slots.release()

        try:
            if run.task in self.registry:  # an unknown task never starts: FAILED only
                await self._send(self._event(run, State.STARTED, deadline_ms=self._deadline(run)))
                self._hook("before_process", run)
            self._schedule_heartbeat(ex)
            ex.exec_task = asyncio.create_task(
                self._executor.execute(run, heartbeat=lambda: self._heartbeat_threadsafe(ex))
            )
            try:
                outcome = await ex.exec_task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                outcome = self._hand_back_outcome(ex)
            finally:
                if ex.beat is not None:
                    ex.beat.cancel()
            ex.outcome = outcome
            if outcome.lingering is not None and not self._draining:
                # A timed-out sync task still occupies its thread: keep the slot until it ends.
                lingering = outcome.lingering
                loop = asyncio.get_running_loop()
                lingering.add_done_callback(lambda _f: loop.call_soon_threadsafe(release))
            else:
                release()
            if await self._deliver(self._final_event(run, outcome)):
                self._hook("after_process", run, outcome)
                for tracker, offset in ex.offsets:
                    self._done(tracker, offset)
            self._inflight.pop((run.run_id, run.attempt), None)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "processing a run failed; its offset stays uncommitted",
                extra={"run_id": run.run_id, "attempt": run.attempt},
            )
            self._inflight.pop((run.run_id, run.attempt), None)
        finally:
            if ex.outcome is None or ex.outcome.lingering is None or self._draining:
                release()

    def _hand_back_outcome(self, ex: _Execution) -> Outcome:
        return Outcome(
            State.FAILED,
            int((time.monotonic() - ex.started) * 1000),
            error="WorkerShutdown: the worker stopped before the run finished",
            reason=HANDBACK_REASON,
            retry_delay_ms=0,
        )

    async def _stale(self, run: Run, tracker: OffsetTracker, offset: int, reason: str) -> None:
        if await self._deliver(self._event(run, State.STALE, reason=reason)):
            self._done(tracker, offset)
        self._hook("after_skip", run, State.STALE, reason)

    def _done(self, tracker: OffsetTracker, offset: int) -> None:
        with self._lock:
            tracker.mark_done(offset)

    # --- heartbeats -----------------------------------------------------------------------

    def _schedule_heartbeat(self, ex: _Execution) -> None:
        """Beat every third of the visibility timeout: two beats may be lost before the
        scheduler's deadline passes. A timer, not a task: this runs for every execution."""
        loop = asyncio.get_running_loop()
        interval_s = max(0.05, ex.run.visibility_timeout_ms / 3 / 1000)

        def tick() -> None:
            self._heartbeat(ex, explicit=False)
            ex.beat = loop.call_later(interval_s, tick)

        ex.beat = loop.call_later(interval_s, tick)

    def _heartbeat_threadsafe(self, ex: _Execution) -> None:
        """``heartbeat()`` called by task code, from a worker thread or the loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._heartbeat, ex, True)

    def _heartbeat(self, ex: _Execution, explicit: bool) -> None:
        if ex.outcome is not None or self._closing:
            return
        now = self._clock.now_ms()
        # Explicit calls are rate limited: a task calling heartbeat() in a loop must not flood
        # the status topic; a tenth of the visibility timeout keeps deadlines comfortably fresh.
        if explicit and now - ex.last_heartbeat_ms < max(100, ex.run.visibility_timeout_ms // 10):
            return
        ex.heartbeats += 1
        ex.last_heartbeat_ms = now
        event = self._event(
            ex.run,
            State.HEARTBEAT,
            suffix=f":{ex.heartbeats}",
            now_ms=now,  # the deadline is "this heartbeat + the visibility timeout"
            deadline_ms=now + ex.run.visibility_timeout_ms,
        )
        # Enqueued right here, not in a task: a heartbeat must never overtake the run's
        # terminal event, which _process enqueues after this callback.
        assert self._producer is not None
        try:
            delivery = self._producer.enqueue_nowait(*self._record(event))
        except BrokerError as exc:
            delivery = None
            log.warning("heartbeat not sent", extra={"run_id": ex.run.run_id, "error": str(exc)})
        if delivery is None:
            log.warning("heartbeat dropped: producer queue full", extra={"run_id": ex.run.run_id})
            return
        delivery.add_done_callback(_log_heartbeat_failure)

    # --- status events --------------------------------------------------------------------

    def _deadline(self, run: Run) -> int:
        return self._clock.now_ms() + run.visibility_timeout_ms

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

    def _final_event(self, run: Run, outcome: Outcome) -> StatusEvent:
        return self._event(
            run,
            outcome.state,
            duration_ms=outcome.duration_ms,
            result_json=outcome.result_json,
            error=outcome.error,
            reason=outcome.reason,
            retry_delay_ms=outcome.retry_delay_ms,
        )

    def _record(self, event: StatusEvent) -> tuple[str, bytes, bytes, list[tuple[str, bytes]]]:
        """The acks record of an event: keyed by job id (so it lands in the job's partition),
        its state in a header (so the scheduler skips STARTED without decoding it)."""
        headers = [(STATE_HEADER, event.state.value.encode())]
        return self._acks_topic, key_for(event.job_id), self._codec.encode(event), headers

    async def _send(self, event: StatusEvent) -> asyncio.Future[None]:
        """Enqueue an event on the acks topic."""
        assert self._producer is not None
        return await self._producer.enqueue(*self._record(event))

    async def _deliver(self, event: StatusEvent) -> bool:
        """Send until acknowledged: the offset commit waits for this event, so giving up would
        stall the partition. Gives up only when the pool is closing (the record is then
        re-delivered to the next owner)."""
        delay = 0.1
        while True:
            try:
                await (await self._send(event))
                return True
            except BrokerError as exc:
                log.warning(
                    "status event not delivered; retrying",
                    extra={"run_id": event.run_id, "state": event.state.value, "error": str(exc)},
                )
                if self._closing:
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _hook(self, name: str, *args: Any) -> None:
        for mw in self.middleware:
            try:
                getattr(mw, name)(*args)
            except Exception:
                log.exception("middleware hook failed", extra={"hook": name})

    # --- shutdown -------------------------------------------------------------------------

    async def _shutdown(self, dispatch: asyncio.Task[None]) -> None:
        self._draining = True
        dispatch.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await dispatch
        running = [ex for ex in self._inflight.values() if ex.outcome is None]
        log.info(
            "worker stopping",
            extra={"running": len(running), "grace_s": self.grace_s},
        )
        pending = {t for t in self._tasks if not t.done()}
        if pending:
            everything = asyncio.ensure_future(asyncio.wait(pending))
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                {everything, hurry}, timeout=self.grace_s, return_when=asyncio.FIRST_COMPLETED
            )
            everything.cancel()
            hurry.cancel()
        # Hand back what is still executing: FAILED with retry 0, so it is re-dispatched at once.
        handed = [ex for ex in self._inflight.values() if ex.outcome is None and ex.exec_task]
        for ex in handed:
            assert ex.exec_task is not None
            ex.exec_task.cancel()
            log.warning(
                "run handed back",
                extra={"run_id": ex.run.run_id, "attempt": ex.run.attempt, "reason": "shutdown"},
            )
        pending = {t for t in self._tasks if not t.done()}
        if pending:
            _done, still = await asyncio.wait(pending, timeout=HAND_BACK_TIMEOUT_S)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=1.0)

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


def _log_heartbeat_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("heartbeat not delivered", extra={"error": str(future.exception())})
