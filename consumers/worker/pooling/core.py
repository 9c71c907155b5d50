"""What the parts of the worker pool share: its state, its lifecycle (run, stop, shutdown, close)
and its two threads' hand-offs. Mixed in by :class:`jobwheel.consumers.worker.pool.WorkerPool`
with :mod:`.intake`, :mod:`.execution` and :mod:`.verdicts`."""

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jobwheel.clock import Clock, SystemClock
from jobwheel.consumers.worker.executor import Executor, Outcome, Prepared
from jobwheel.consumers.worker.kafka import RunsConsumer, StatusProducer
from jobwheel.consumers.worker.metrics import WorkerMeters
from jobwheel.consumers.worker.middleware import Middleware, default_middleware
from jobwheel.consumers.worker.registry import TaskRegistry, default_registry
from jobwheel.consumers.worker.tracking import LatestAttempts, OffsetTracker
from jobwheel.errors import BrokerError
from jobwheel.retry import Backoff
from jobwheel.schemas import validation
from jobwheel.schemas import workers as roster
from jobwheel.schemas.models import DEFAULT_QUEUE, Run
from jobwheel.settings import Settings
from jobwheel.watchdog import kafka_reachable

# The pool logs under its public name whichever part of it speaks (operators filter on it).
log = logging.getLogger("jobwheel.consumers.worker.pool")

T = TypeVar("T")

POLL_TIMEOUT_S = 0.1
FETCH_BATCH = 500
SWEEP_INTERVAL_S = 0.05
FULL_WAIT_S = 1.0
HAND_BACK_TIMEOUT_S = 10.0
#: Once the runs are done (finished, or handed back after the grace period), the time the
#: worker gives the broker, in total, to acknowledge its verdicts, take its final offset commit
#: and let it leave the group. Not the grace period (``JOBWHEEL_WORKER_SHUTDOWN_GRACE_MS``):
#: that is for task code, and an orchestrator's kill deadline is set just above it (Kubernetes:
#: 30 s for a 25 s grace), so waiting as long again for a broker would end in SIGKILL, which
#: loses the line that says what was left undone. A reachable broker needs milliseconds for all
#: three; an unreachable one never answers (librdkafka retries the commit and the leave for as
#: long as it is down), so a longer wait buys nothing. 10 s is what the pool already gave the
#: verdicts before this budget existed, enough for a leader election to finish.
CLOSE_TIMEOUT_S = 10.0
#: After a second :meth:`PoolCore.stop`: what is left of that budget, at most (the hand-back
#: verdicts and the commit still go out to a reachable broker; an unreachable one is not waited
#: for).
HURRIED_CLOSE_S = 1.0
#: The part of either budget the verdicts may take: one that is never acknowledged must not
#: cost the final commit of every run acknowledged before it.
_VERDICTS_SHARE = 0.5
#: The verdict flush waits in slices this long, so a second stop() is heard.
_FLUSH_SLICE_S = 0.1
#: After a revoke's grace period, how long the verdicts of the runs handed back may take before
#: the partitions are handed over without them (their runs are then delivered again).
REVOKE_HAND_BACK_S = 5.0
#: A revoke's waits check for a second stop() this often.
SETTLE_SLICE_S = 0.05
#: Offsets one partition may keep behind its oldest unfinished run before it is paused (resumed
#: at half): what a long run costs in memory and in commit metadata stays bounded.
TRACKED_LIMIT = 10_000
#: The ``reason`` of the STARTED event of a run that may be running for the second time.
REPEAT_REASON = (
    "possibly a repeat: the partition's previous owner had started it and went away without "
    "a verdict (a crash?); this execution has the same attempt"
)
#: How often the consumer thread samples its partitions' lag for the metrics.
LAG_SAMPLE_S = 0.5
#: How often the consumer thread checks that the runs consumer is in its group.
MEMBERSHIP_CHECK_S = 5.0
#: A runs consumer holding no partition and no member id for this many session timeouts (at
#: least :data:`MIN_OUTSIDE_S`), counted while Kafka accepts connections, has stopped joining
#: its group and is replaced (:meth:`~.intake.Intake._check_membership`).
OUTSIDE_SESSIONS = 3
MIN_OUTSIDE_S = 30.0
#: How often every watermark is committed again, moved or not (the periodic commits are
#: asynchronous and their outcome is not checked: one the broker refused is sent again).
COMMIT_REFRESH_S = 5.0
_MAX_REDELIVERY_DELAY_S = 5.0

#: An encoded record the pool sends (an event on the acks topic, a dead-letter copy): topic,
#: key, value, headers.
_AckRecord = tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]


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
    #: The partition's previous owner may have been executing it when it went away (a crash):
    #: its STARTED event says so.
    repeat: bool = False
    outcome: Outcome | None = None
    acked: bool = False
    #: Sending its verdict again after a failed delivery: 0.1 s, doubling up to the cap.
    redelivery: Backoff = field(
        default_factory=lambda: Backoff(start_s=0.1, max_s=_MAX_REDELIVERY_DELAY_S)
    )

    @property
    def key(self) -> tuple[str, int]:
        return (self.run.run_id, self.run.attempt)


@dataclass(eq=False, slots=True)
class _Undecodable:
    """A runs record no Run could be read from, while its dead-letter copy (and the FAILED
    verdict of the run it names) are on their way; ``waiting`` (pool lock) counts the records
    the broker has not acknowledged yet, and its offset is done at 0."""

    tracker: OffsetTracker
    offset: int
    waiting: int
    redelivery: Backoff = field(
        default_factory=lambda: Backoff(start_s=0.1, max_s=_MAX_REDELIVERY_DELAY_S)
    )


class PoolCore:
    """Consumes the runs topic of one queue as a member of its group until :meth:`stop`.

    :param queue: the queue (worker pool) served: its runs topic
        (:func:`jobwheel.schemas.topics.runs_topic`) in the group
        :meth:`Settings.worker_group_for` names (``JOBWHEEL_WORKER_GROUP`` for ``default``).
    :param concurrency: runs executing at once (default ``settings.worker_concurrency``).
    :param grace_ms: shutdown grace (default ``settings.worker_shutdown_grace_ms``).
    :param middleware: hooks around processing (default: structured logging)."""

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
        queue: str = DEFAULT_QUEUE,
    ) -> None:
        """Long on purpose: it only sets the attributes the pool's parts (``pooling/``) share,
        grouped by the thread that uses them, so every one is declared in one place (the
        thread pools and the codec are among them); the parameters are in the class's
        docstring."""
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
        self.queue = validation.queue(queue)
        self.group = settings.worker_group_for(queue)
        self._runs_topic = settings.topics.runs_for(queue)
        self._queue_header = queue.encode()
        self._acks_topic = settings.topics.acks
        self._dead_letter_topic = settings.topics.dead_letter
        self._workers_topic = settings.topics.workers
        self._announce_s = settings.worker_announce_interval_ms / 1000
        self._announcer: asyncio.Task[None] | None = None
        self._announce_failing = False  # said once until a record gets through again
        self.started_ms = 0
        #: (monotonic s, runs finished) at the last announcement: the announced rate's start.
        self._rate_mark: tuple[float, int] | None = None
        #: Task names this worker got runs of and does not serve: each said once.
        self.unknown_tasks_said: set[str] = set()
        self._rng = rng if rng is not None else random.Random()
        self._started_event_s = max(0, settings.worker_started_event_ms) / 1000
        self._commit_interval_s = max(0, settings.worker_commit_interval_ms) / 1000
        self._task_threads = concurrent.futures.ThreadPoolExecutor(
            self.concurrency, thread_name_prefix="jobwheel-task"
        )
        self._executor = Executor(self.registry, self._task_threads, rng=rng)
        self._kafka_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="jobwheel-consumer"
        )
        # Shared by the consumer thread, the delivery thread and the loop: trackers. A
        # condition: a revoke waits on it for the acknowledgements of its runs.
        self._lock = threading.Condition(threading.Lock())
        self._trackers: dict[int, OffsetTracker] = {}
        #: What the last ownership of a partition knew was done (OffsetTracker.known_done).
        self._remembered: dict[int, tuple[int | None, set[int]]] = {}
        self._held: set[int] = set()  # paused: too many offsets behind an unfinished run
        self._paused_parts: set[int] = set()  # consumer thread: paused in the client now
        self._hurry_seen = False  # a second stop(), for the consumer thread
        self._last_commit = 0.0
        self._last_refresh = 0.0  # consumer thread: the last commit of every watermark
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
        # Verdicts sent and not acknowledged yet (added on the loop, removed by the delivery
        # thread: set.add and set.discard are atomic), counted when the worker gives up.
        self._unacked: set[_Execution | _Undecodable] = set()
        self._close_from: float | None = None  # monotonic: when the runs were done
        self._hurried_at: float | None = None  # monotonic: the second stop()
        #: Set by :meth:`run` on the way out: verdicts or offsets were left for the next
        #: worker (the broker did not take them in time), so the process should exit non-zero.
        self.left_undone = False
        #: Set by :meth:`run` on the way out: a Kafka client call was still blocked when the
        #: worker gave up on it (in a daemon thread); exit without the interpreter's teardown,
        #: which could wait for it or destroy its client under it.
        self.abandoned = False
        #: Async runs that ignored their cancellation at shutdown (the process must not wait).
        self.stuck_tasks = 0
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
        # Consumer thread: the membership check (Intake._check_membership).
        self._reachable = kafka_reachable(settings)
        self._membership_at = 0.0
        self._outside_since: float | None = None
        self._stop_rejoining = False  # worker_fault_stop_rejoining, due at the next poll

    def stop(self) -> None:
        """Graceful stop; a second call skips the rest of the grace period and of the wait for
        the broker (at most :data:`HURRIED_CLOSE_S` more). Loop thread only."""
        if self._stop_requested.is_set() and self._hurried_at is None:
            self._hurried_at = time.monotonic()
            self._hurry_seen = True
            self._hurry.set()
        self._stop_requested.set()

    def purge(self) -> None:
        """Any thread, when the process exits without its shutdown: drop the status events
        still queued (their runs are not committed, so they are delivered again)."""
        producer = self._producer
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.purge()

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
        self._consumer = self._new_consumer()
        await self._in_consumer_thread(
            self._consumer.subscribe, self._on_assign, self._on_revoke, self._on_lost
        )
        self.started_ms = self._clock.now_ms()
        self._announcer = asyncio.create_task(self._announce_loop(), name="jobwheel-announce")
        log.info(
            "worker started",
            extra={
                "worker": self.worker_id,
                "queue": self.queue,
                "topic": self._runs_topic,
                "group": self.group,
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
            await self._close(fetch)
        if fatal is not None:
            raise fatal

    def _new_consumer(self) -> RunsConsumer:
        return RunsConsumer(
            self.settings, self._runs_topic, self.group, **{"client.id": "jobwheel-worker"}
        )

    async def _in_consumer_thread(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._kafka_thread, lambda: fn(*args))

    def _threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)

    def _hook(self, name: str, *args: Any) -> None:
        for mw in self.middleware:
            try:
                getattr(mw, name)(*args)
            except Exception:
                log.exception("middleware hook failed", extra={"hook": name})

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
        tasks: dict[asyncio.Task[None], _Execution] = {}
        for ex in list(self._active):
            log.warning(
                "run handed back",
                extra={"run_id": ex.run.run_id, "attempt": ex.run.attempt, "reason": "shutdown"},
            )
            if ex.task is not None and not ex.task.done():
                ex.handing_back = True
                ex.task.cancel()
                tasks[ex.task] = ex
            else:  # a sync task: its thread cannot be stopped, the run is given up here
                self._finish(ex, self._hand_back_outcome(ex))
        if tasks:
            _done, still = await asyncio.wait(tasks, timeout=HAND_BACK_TIMEOUT_S)
            for task in still:
                # It swallows its cancellation: given up like a sync task's thread (its run
                # handed back now), and the process leaves without waiting for it.
                task.cancel()
                self._finish(tasks[task], self._hand_back_outcome(tasks[task]))
                self.stuck_tasks += 1
        # The runs are done; what is left needs the broker, which gets CLOSE_TIMEOUT_S. The
        # fetch loop keeps polling meanwhile (the group membership stays alive, and offsets the
        # acknowledgements complete are committed as usual).
        self._close_from = time.monotonic()
        await self._flush_verdicts()
        self._reap()

    def _close_deadline(self, share: float = 1.0) -> float:
        """When (that ``share`` of) the wait for the broker ends: :data:`CLOSE_TIMEOUT_S` after
        the runs were done, or :data:`HURRIED_CLOSE_S` after a second stop() (counted from when
        the wait began if that signal came during the grace period, so the hand-backs still go
        out to a reachable broker)."""
        start = self._close_from if self._close_from is not None else time.monotonic()
        deadline = start + CLOSE_TIMEOUT_S * share
        if self._hurried_at is not None:
            deadline = min(deadline, max(start, self._hurried_at) + HURRIED_CLOSE_S * share)
        return deadline

    async def _until_deadline(self, fut: asyncio.Future[Any]) -> bool:
        """Wait for ``fut`` until the close deadline (which a second stop() brings forward);
        True if it is done. ``fut`` is left running either way."""
        while not fut.done():
            left = self._close_deadline() - time.monotonic()
            if left <= 0:
                return False
            waiters: set[asyncio.Future[Any]] = {fut}
            hurry = None if self._hurry.is_set() else asyncio.ensure_future(self._hurry.wait())
            if hurry is not None:
                waiters.add(hurry)
            await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if hurry is not None:
                hurry.cancel()
        return True

    async def _flush_verdicts(self) -> None:
        """Wait for the verdicts' acknowledgements, which complete the offsets committed last,
        for their share of the close budget. In short slices: librdkafka's flush cannot be
        interrupted, and a second stop() must not wait for it."""
        producer = self._producer
        if producer is None:
            return
        loop = asyncio.get_running_loop()
        while self._unacked:
            left = self._close_deadline(_VERDICTS_SHARE) - time.monotonic()
            if left <= 0:
                return
            queued = await loop.run_in_executor(None, producer.flush, min(_FLUSH_SLICE_S, left))
            if not queued and self._unacked:  # a verdict waits for its retry timer
                await asyncio.sleep(min(_FLUSH_SLICE_S, max(0.0, left)))

    async def _close(self, fetch: asyncio.Task[None]) -> None:
        """Commit the final watermarks, leave the group, close the producer, in the time left
        of the close budget; then say in one line what the broker did not get.

        The commit and the leave run in a daemon thread that is abandoned if the broker does not
        answer in time: with the broker unreachable, librdkafka blocks a synchronous commit, and
        ``Consumer.close()`` (the revoke callback's commit, then leaving the group, under the
        classic or the KIP-848 protocol) for as long as it is down. Nothing more is committed
        than what was done and acknowledged, so whatever is not committed is delivered again to
        the partition's next owner (at-least-once)."""
        if self._close_from is None:  # the shutdown failed before the runs were done
            self._close_from = time.monotonic()
        # The consumer thread is free once the fetch loop has returned (its poll is short, but
        # a rebalance's commit inside it is not): only then may another thread use the consumer.
        fetched = await self._until_deadline(fetch)
        if fetched:
            with contextlib.suppress(asyncio.CancelledError, BrokerError):
                fetch.result()  # a fatal error was taken before the shutdown; later ones end here
        # Runs done since the last commit, which the next owner runs again unless the final
        # commit gets through. (It also repeats the watermarks committed asynchronously before,
        # unconfirmed; failing that loses nothing, so only these are reported.)
        moved = {p: offset for p, (offset, _meta) in self._moved_offsets().items()}
        committed = False
        left_group = self._consumer is None
        abandoned = not fetched
        if self._consumer is not None and fetched:
            leave = asyncio.wrap_future(
                _in_daemon_thread(
                    functools.partial(self._leave, self._consumer, self._final_offsets()),
                    "jobwheel-consumer-close",
                )
            )
            if await self._until_deadline(leave):
                try:
                    committed = leave.result()
                    left_group = True
                except Exception as exc:  # a client error closing: the group is not left
                    log.warning("closing the runs consumer failed", extra={"error": str(exc)})
            else:
                abandoned = True
        remaining = 0
        if self._announcer is not None:
            self._announcer.cancel()
        if self._producer is not None:
            self._withdraw()
            producer = self._producer
            left = max(0.0, self._close_deadline() - time.monotonic())
            remaining = await asyncio.get_running_loop().run_in_executor(None, producer.close, left)
        self._reap()
        uncommitted = {} if committed else moved
        self.abandoned = abandoned
        self.left_undone = bool(self._unacked) or bool(uncommitted)
        if self.left_undone or remaining or not left_group:
            self._report_undone(uncommitted, remaining, left_group)
        self._kafka_thread.shutdown(wait=fetched)
        self._task_threads.shutdown(wait=False, cancel_futures=True)
        log.info("worker stopped", extra={"worker": self.worker_id})

    def announcement(self) -> roster.WorkerRecord:
        """This worker as the workers topic tells it (:mod:`jobwheel.schemas.workers`)."""
        return roster.WorkerRecord(
            worker_id=self.worker_id,
            group=self.group,
            tasks=tuple(self.registry.names()),
            host=socket.gethostname(),
            pid=os.getpid(),
            started_ms=self.started_ms,
            announced_ms=self._clock.now_ms(),
            interval_ms=int(self._announce_s * 1000),
            inflight=self.inflight,
            concurrency=self.concurrency,
            finished_per_s=self._finished_rate(),
        )

    def _finished_rate(self) -> float:
        """Runs finished per second since the previous announcement (0 at the first)."""
        now, finished = time.monotonic(), self.meters.finished
        mark, self._rate_mark = self._rate_mark, (now, finished)
        if mark is None or now <= mark[0]:
            return 0.0
        return round((finished - mark[1]) / (now - mark[0]), 3)

    async def _announce_loop(self) -> None:
        """Announce this worker's tasks now and every interval until the shutdown, so submit,
        the SDK and the API can tell a task no live worker serves (a typo, a worker with other
        ``--tasks``) before they send it. A failed announcement is not fatal: runs go on; the
        readers just stop seeing this worker live after three intervals."""
        while True:
            self._announce(roster.encode(self.announcement()))
            await asyncio.sleep(self._announce_s)  # a cadence, not a synchronisation

    def _announce(self, value: bytes | None) -> None:
        producer = self._producer
        if producer is None:
            return

        def delivered(error: Any) -> None:
            if error is None:
                self._announce_failing = False
            elif not self._announce_failing:
                self._announce_failing = True
                log.warning(
                    "could not announce this worker's tasks on the workers topic",
                    extra={
                        "topic": self._workers_topic,
                        "error": str(error),
                        "detail": "runs go on; submit and the API may warn that no live worker "
                        "serves its tasks. Run `jobwheel topics ensure` if the topic is "
                        "missing; with ACLs the worker role needs WRITE on it",
                    },
                )

        try:
            producer.produce(self._workers_topic, self.worker_id.encode(), value, None, delivered)
        except BrokerError as exc:  # refused before queueing (no such topic known yet ...)
            delivered(exc)

    def _withdraw(self) -> None:
        """The tombstone of this worker on the workers topic: a clean exit leaves the roster
        at once, not three intervals later."""
        self._announce(None)

    def _leave(self, consumer: RunsConsumer, offsets: dict[int, int]) -> bool:
        """The close thread: commit ``offsets`` synchronously, then leave the group. True if
        the commit went through (or there was nothing to commit)."""
        committed = self._commit_offsets(offsets, asynchronous=False) if offsets else True
        consumer.close()
        return committed

    def _report_undone(self, uncommitted: dict[int, int], events: int, left_group: bool) -> None:
        """The one line about what the broker did not get before the worker gave up."""
        verdicts = len(self._unacked)
        undone = []
        if verdicts:
            undone.append(f"deliver {verdicts} verdict{'s' if verdicts != 1 else ''}")
        if uncommitted:
            undone.append(f"commit the offsets of partitions {sorted(uncommitted)}")
        if not left_group:
            undone.append("leave the group")
        if not undone:
            undone.append(f"deliver {events} status event{'s' if events != 1 else ''}")
        what = undone[-1] if len(undone) == 1 else f"{', '.join(undone[:-1])} or {undone[-1]}"
        why = (
            "a second stop signal cut the wait for the broker short"
            if self._hurried_at is not None
            else f"broker unreachable (no answer within {CLOSE_TIMEOUT_S:g} s)"
        )
        if verdicts or uncommitted:
            then = "those runs will be delivered again to another worker"
        elif not left_group:
            then = "its partitions move to other workers when its session times out"
        else:
            then = "only progress events (STARTED, HEARTBEAT) and announcements are lost"
        log.log(
            logging.ERROR if self.left_undone else logging.WARNING,
            "could not hand work over to the broker before exiting",
            extra={
                "worker": self.worker_id,
                "detail": f"could not {what}: {why}; {then}",
                "undelivered_verdicts": verdicts,
                "undelivered_events": events,
                "uncommitted_offsets": uncommitted,
                "left_group": left_group,
                "reason": why,
            },
        )


def _in_daemon_thread(fn: Callable[[], T], name: str) -> concurrent.futures.Future[T]:
    """``fn()`` in a new daemon thread, its outcome in the future returned. For a client call
    that may block forever: a thread of an executor would hold up the interpreter's exit."""
    fut: concurrent.futures.Future[T] = concurrent.futures.Future()

    def target() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:
            fut.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    return fut


def _task_error(task: asyncio.Task[Any]) -> BaseException | None:
    if not task.done() or task.cancelled():
        return None
    return task.exception()
