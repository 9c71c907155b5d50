"""The SDK services use to schedule jobs: :class:`JobClient` (blocking) and :class:`AsyncJobClient`.

Both validate a request completely before anything is sent (the options of a job are
:class:`~jobwheel.producers.spec.JobSpec`; the contract's rules are in
:mod:`jobwheel.schemas.validation`), key
every command by the job id's UTF-8 bytes (so all commands of a job land in one partition, in
order, murmur2-partitioned like the scheduler expects), encode with the codec, and only return
once the broker acknowledged the record: a job id returned by ``schedule`` is durable, and a
failed delivery raises :class:`jobwheel.errors.DeliveryError` at the call site.

Kafka not there at all is said as such, soon: before a client's first command (and the first
after a failed delivery) a TCP probe of the bootstrap servers (:mod:`jobwheel.reach`, at most
:data:`CONNECT_TIMEOUT_S` per server; a refused connection answers at once) raises
:class:`jobwheel.errors.BrokerConnectionError` naming the address and what to do, and a
delivery that timed out while no server accepts a connection raises the same. Without the
probe librdkafka retried the refused connection until the record's ``message.timeout.ms``
(30 s) and the caller got "Local: Message timed out" after warnings about the connection. The
probe comes before the producer is made, so a client that cannot reach Kafka prints nothing.

High rates: ``schedule_many`` validates the whole batch, produces it, and waits for the
acknowledgements once (one flush instead of one round trip per job).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from jobwheel.clock import Clock, SystemClock
from jobwheel.errors import (
    BrokerConnectionError,
    BrokerError,
    DeliveryError,
    UnknownTaskWarning,
    ValidationError,
)
from jobwheel.kafka.producer import Delivered, Producer, producer_config
from jobwheel.kafka.queues import QueueDirectory, admin_topic_lister
from jobwheel.producers.spec import JobSpec, build_schedule, spec_from_mapping
from jobwheel.producers.workers import TaskCheck, TaskCheckMode
from jobwheel.reach import require_reachable
from jobwheel.schemas import validation as rules
from jobwheel.schemas.codec import Codec, default_codec
from jobwheel.schemas.models import (
    CancelJob,
    JobCommand,
    PauseJob,
    ResumeJob,
    ScheduleJob,
    TriggerJob,
)
from jobwheel.schemas.partitioning import key_for
from jobwheel.schemas.timetext import instant_value_ms
from jobwheel.settings import Settings

log = logging.getLogger(__name__)

#: Jobs a client remembers having scheduled (for ``wait``), the most recent.
REMEMBERED_JOBS = 10_000
#: How long the probe before a client's first command waits for each bootstrap server to
#: accept a TCP connection (a refused one answers at once).
CONNECT_TIMEOUT_S = 2.0
#: A command still unsent this long after it was issued is issued again as it is sent. Why: a
#: large ``schedule_many`` builds, checks and encodes every command before it sends the first
#: (50,000 took 2.7 s), and the scheduler holds an issue time to within
#: ``JOBWHEEL_SCHEDULER_CLOCK_TOLERANCE_MS`` (2 s) of its record's broker time, logging a warning
#: each time as if this machine's clock were wrong. Triggers then count from when a command is
#: sent, as ``jobwheel submit``'s do.
REISSUE_AFTER_MS = 500
#: Delivery failures that may mean Kafka is gone: the client then probes, and says so if it is.
_UNREACHABLE_CODES = frozenset({"_MSG_TIMED_OUT", "_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN"})


def _spec(item: JobSpec | Mapping[str, Any]) -> JobSpec:
    if isinstance(item, JobSpec):
        return item
    if isinstance(item, Mapping):
        return spec_from_mapping(item)
    raise ValidationError("spec", f"expected a JobSpec or a mapping, got {type(item).__name__}")


_CONTROL = {"cancel": CancelJob, "pause": PauseJob, "resume": ResumeJob, "trigger": TriggerJob}


class _Commands:
    """Building and encoding commands; shared by the sync and async clients."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None,
        codec: Codec | None,
        producer: Producer | None,
        producer_overrides: Mapping[str, Any] | None,
        known_tasks: Collection[str] | None = None,
        task_check: TaskCheckMode = "warn",
    ) -> None:
        self.settings = settings
        self.topic = settings.topics.requests
        self.clock = clock or SystemClock()
        self.codec = codec or default_codec(settings.schema_registry_url)
        self.known_tasks = None if known_tasks is None else frozenset(known_tasks)
        # Told the tasks (known_tasks): that list is the check, not the workers topic.
        self.tasks = TaskCheck(settings, "off" if known_tasks is not None else task_check)
        self._producer = producer
        self._producer_overrides = dict(producer_overrides or {})
        self._producer_lock = threading.Lock()
        #: probe the bootstrap servers before the next send (the first, or after a failure)
        self._probe = True
        #: JOBWHEEL_QUEUES and the queues added at run time: a job naming neither is refused
        #: before it is sent (when the broker cannot be asked, the scheduler decides).
        self.queues = QueueDirectory(
            settings, admin_topic_lister(settings, "jobwheel.producers"), benefit_of_doubt=True
        )

    @property
    def producer(self) -> Producer:
        """The producer, made on first use: a client that cannot reach Kafka never starts
        librdkafka's reconnect loop (and its log lines)."""
        if self._producer is None:
            with self._producer_lock:
                if self._producer is None:
                    self._producer = Producer(
                        producer_config(self.settings, **self._producer_overrides)
                    )
        return self._producer

    @property
    def started(self) -> bool:
        return self._producer is not None

    def reach(self) -> None:
        """Before the client's first send and the first after a failed one: raise
        :class:`BrokerConnectionError` when no bootstrap server accepts a connection."""
        if self._probe:
            require_reachable(self.settings.bootstrap_servers, CONNECT_TIMEOUT_S)
            self._probe = False

    def failed(self, err: BrokerError) -> BrokerError:
        """What the caller gets for a failed delivery: :class:`BrokerConnectionError` when it
        may mean Kafka is gone and no bootstrap server accepts a connection now, else ``err``.
        The next send probes first either way."""
        self._probe = True
        if err.code not in _UNREACHABLE_CODES:
            return err
        try:
            self.reach()
        except BrokerConnectionError as exc:
            return BrokerConnectionError(f"{exc}; not delivered: {err}", code=exc.code)
        return err

    def build_schedule(self, spec: JobSpec, now_ms: int) -> JobCommand:
        command = build_schedule(
            spec,
            now_ms=now_ms,
            max_args_bytes=self.settings.max_args_bytes,
            queues=self.queues,
        )
        task = spec.task
        if self.known_tasks is not None and task not in self.known_tasks:
            names = sorted(self.known_tasks)
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            warnings.warn(
                f"task {task!r} is not one the workers register ({shown or 'none given'}): a "
                "worker that gets its run fails it without retrying, so the run ends DEAD (and "
                "a one-off job DEAD); check the name, or the --tasks modules of the workers",
                UnknownTaskWarning,
                stacklevel=_caller_level(),
            )
        return command

    def check_tasks(
        self, commands: list[JobCommand], *, warn: bool = True, refuse: bool = False
    ) -> list[str]:
        """The task check of the ScheduleJobs among ``commands`` (see :class:`TaskCheck`);
        ``refuse`` refuses whatever the client's mode."""
        tasks = [(c.body.task, c.body.queue) for c in commands if isinstance(c.body, ScheduleJob)]
        mode: TaskCheckMode = "refuse" if refuse else self.tasks.mode
        if not tasks or mode == "off":
            return []
        self.reach()  # a broker that is not there is said as such, not as "cannot tell"
        return self.tasks.check(tasks, _caller_level() if warn else None, mode)

    def build_control(self, kind: str, job_id: str, reason: str | None, now_ms: int) -> JobCommand:
        body = _CONTROL[kind](rules.optional_text(reason, "reason", rules.MAX_REASON_CHARS))
        return JobCommand(uuid.uuid4().hex, rules.job_id(job_id), now_ms, body)

    def check(self, command: JobCommand, now_ms: int) -> JobCommand:
        if not isinstance(command, JobCommand):
            raise ValidationError("command", f"expected a JobCommand, got {type(command)!r}")
        return rules.check_command(
            command, now_ms=now_ms, max_args_bytes=self.settings.max_args_bytes
        )

    def encode(self, command: JobCommand) -> tuple[bytes, bytes]:
        return key_for(command.job_id), self.codec.encode(command)

    def as_sent(self, command: JobCommand, record: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
        """The record of ``command`` (``record``, its :meth:`encode`) as it is sent now: issued
        again now when it was issued more than :data:`REISSUE_AFTER_MS` ago. Its encoding was
        checked already; only the issue time differs."""
        now_ms = self.clock.now_ms()
        if now_ms - command.issued_at_ms <= REISSUE_AFTER_MS:
            return record
        return self.encode(dataclasses.replace(command, issued_at_ms=now_ms))


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside this module (the
    caller's ``schedule`` line, however many of our frames are in between)."""
    import sys

    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def _batch_error(failures: list[tuple[str, DeliveryError]], total: int) -> DeliveryError:
    first_id, first = failures[0]
    ids = ", ".join(job_id for job_id, _ in failures[:5])
    more = f" and {len(failures) - 5} more" if len(failures) > 5 else ""
    return DeliveryError(
        f"{len(failures)} of {total} commands not delivered (jobs {ids}{more}); "
        f"first error: {first}",
        code=first.code,
    )


class _Client:
    """What both clients are made of: the settings, codec and producer behind their commands."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        codec: Codec | None = None,
        producer: Producer | None = None,
        producer_overrides: Mapping[str, Any] | None = None,
        delivery_timeout_s: float = 60.0,
        known_tasks: Collection[str] | None = None,
        task_check: TaskCheckMode = "warn",
    ) -> None:
        self._c = _Commands(
            settings,
            clock=clock,
            codec=codec,
            producer=producer,
            producer_overrides=producer_overrides,
            known_tasks=known_tasks,
            task_check=task_check,
        )
        self.delivery_timeout_s = delivery_timeout_s
        self._setup()

    def _setup(self) -> None:
        """The client's own state (a subclass's)."""

    @property
    def topic(self) -> str:
        return self._c.topic

    @property
    def queues(self) -> QueueDirectory:
        """The queues a job may name: ``JOBWHEEL_QUEUES`` and those added at run time."""
        return self._c.queues


class JobClient(_Client):
    """Blocking client: every method returns after the broker acknowledged the command.

    Safe to share between threads. Use as a context manager or call :meth:`close`.

    Workers announce the tasks they serve on the workers topic (:mod:`jobwheel.producers.
    workers`). Scheduling a task that not every live worker serves (a typo, a worker started
    with other ``--tasks``), or any task while no worker is live, warns
    (:class:`jobwheel.errors.UnknownTaskWarning`, naming the tasks the live workers serve and
    the closest one) and sends the job; ``task_check="refuse"`` raises
    :class:`jobwheel.errors.UnservedTaskError` instead and sends nothing; ``"off"`` does not
    look. With ``known_tasks`` (e.g. ``default_registry.names()``) that list is checked
    instead of the topic (a warning).
    """

    def _setup(self) -> None:
        #: job id -> (issued ms, command id) of the ScheduleJobs this client sent (for wait)
        self._scheduled: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._scheduled_lock = threading.Lock()

    def check_broker(self, timeout_s: float = 5.0) -> None:
        """Fail within ``timeout_s`` when Kafka cannot be reached or the requests topic is
        missing (:class:`BrokerConnectionError` / :class:`BrokerError`, naming the address),
        instead of after the delivery timeout (30 s). The CLI calls it before sending."""
        require_reachable(self._c.settings.bootstrap_servers, min(timeout_s, 2.0))
        self._c.producer.check_topic(self._c.topic, timeout_s)

    def schedule(self, job_id: str | None = None, **options: Any) -> str:
        """Create (or replace) a job; returns its id (a new uuid4 hex unless given).
        ``options`` are the fields of :class:`JobSpec` (``task=`` is required)."""
        return self.schedule_many([JobSpec(job_id=job_id, **options)])[0]

    def schedule_many(self, specs: Iterable[JobSpec | Mapping[str, Any]]) -> list[str]:
        """Validate all, produce all, wait once. Nothing is sent if any spec is invalid."""
        now_ms = self._c.clock.now_ms()
        commands = [self._c.build_schedule(_spec(s), now_ms) for s in specs]
        self._c.check_tasks(commands)
        self._send(commands)
        with self._scheduled_lock:
            for c in commands:
                self._scheduled[c.job_id] = (c.issued_at_ms, c.command_id)
                self._scheduled.move_to_end(c.job_id)
            while len(self._scheduled) > REMEMBERED_JOBS:
                self._scheduled.popitem(last=False)
        return [c.job_id for c in commands]

    def wait(
        self,
        job_id: str,
        timeout: float | timedelta = 60.0,
        *,
        since: datetime | str | None = None,
    ) -> Any:
        """Block until the one-off job ``job_id`` has finished and return its result: the
        task's return value (JSON-decoded), like Celery's ``AsyncResult.get()``.

        Raises :class:`jobwheel.errors.JobFailedError` when the job ended without one (its run
        DEAD, the job CANCELLED, its fire MISSED, its ScheduleJob REJECTED; ``.state`` says
        which) and :class:`jobwheel.errors.WaitTimeoutError` after ``timeout`` (seconds).

        The outcome is read from the job's partition of the status and acks topics (see
        :mod:`jobwheel.producers.results`): no status API needed. For a job this client scheduled
        reading starts just before it was scheduled; for another, at ``since`` (default an
        hour ago; an aware datetime or ISO 8601 text with an offset). A recurring job never
        finishes: wait for a one-off (now, at, in) job.
        """
        from jobwheel.producers.results import wait_for_result

        rules.job_id(job_id)
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        with self._scheduled_lock:
            known = self._scheduled.get(job_id)
        if since is not None:
            since_ms = instant_value_ms(since, "since")
        else:
            since_ms = known[0] if known else None
        return wait_for_result(
            self._c.settings,
            job_id,
            seconds,
            since_ms=since_ms,
            command_id=known[1] if known else None,
            codec=self._c.codec,
        )

    def send(self, command: JobCommand) -> str:
        """Send a command built elsewhere (e.g. received over HTTP), after validating it and
        checking its task like :meth:`schedule` does."""
        self._send_checked(command)
        return command.job_id

    def send_checked(self, command: JobCommand, *, require_worker: bool = False) -> list[str]:
        """:meth:`send`, returning the task check's problems instead of warning them (the API
        answers with them, ``submit`` prints them); ``require_worker`` refuses them
        (:class:`UnservedTaskError`, nothing sent) whatever the client's ``task_check``."""
        return self._send_checked(command, warn=False, refuse=require_worker)

    def _send_checked(
        self, command: JobCommand, *, warn: bool = True, refuse: bool = False
    ) -> list[str]:
        checked = self._c.check(command, self._c.clock.now_ms())
        problems = self._c.check_tasks([checked], warn=warn, refuse=refuse)
        self._send([checked])
        return problems

    def send_raw(
        self, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        """Produce bytes to the requests topic as they are (a dead-lettered command replayed by
        :mod:`jobwheel.producers.deadletters`; it checks them first). Waits for the
        acknowledgement."""
        done: list[DeliveryError | None] = []

        def delivered(err: DeliveryError | None, _: Delivered | None) -> None:
            done.append(err)

        self._c.reach()
        self._c.producer.produce(self._c.topic, value, key, delivered, headers=headers)
        deadline = time.monotonic() + self.delivery_timeout_s
        while not done and time.monotonic() < deadline:
            self._c.producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        if not done:
            raise self._c.failed(
                DeliveryError(
                    f"record not acknowledged within {self.delivery_timeout_s:.0f}s; is the "
                    "broker reachable?",
                    code="_TIMED_OUT",
                )
            )
        if done[0] is not None:
            raise self._c.failed(done[0])

    def cancel(self, job_id: str, reason: str | None = None) -> str:
        """No further fires; an active run finishes. Returns the command id."""
        return self._control("cancel", job_id, reason)

    def pause(self, job_id: str, reason: str | None = None) -> str:
        return self._control("pause", job_id, reason)

    def resume(self, job_id: str, reason: str | None = None) -> str:
        return self._control("resume", job_id, reason)

    def trigger(self, job_id: str, reason: str | None = None) -> str:
        """One run now, outside the schedule. Returns the command id."""
        return self._control("trigger", job_id, reason)

    def _control(self, kind: str, job_id: str, reason: str | None) -> str:
        return self.control(kind, job_id, reason).command_id

    def control(self, kind: str, job_id: str, reason: str | None = None) -> JobCommand:
        """Send ``kind`` (cancel, pause, resume, trigger) for a job; returns the command sent.
        The scheduler answers it with a status event whose id starts with the command id: the
        job's new state, or REJECTED and why (an unknown job, a job the command does not apply
        to). The status API serves that answer at ``GET /jobs/{id}/commands/{command_id}``."""
        if kind not in _CONTROL:
            raise ValidationError("command", f"{kind!r}; one of {', '.join(_CONTROL)}")
        command = self._c.build_control(kind, job_id, reason, self._c.clock.now_ms())
        self._send([command])
        return command

    def _send(self, commands: list[JobCommand]) -> None:
        encoded = [self._c.encode(c) for c in commands]  # all encodable before any is sent
        self._c.reach()
        failures: list[tuple[str, DeliveryError]] = []
        pending = [len(commands)]
        lock = threading.Lock()

        def callback(job_id: str) -> Any:
            def done(err: DeliveryError | None, _: Delivered | None) -> None:
                with lock:
                    pending[0] -= 1
                    if err is not None:
                        failures.append((job_id, err))

            return done

        for command, record in zip(commands, encoded, strict=True):
            key, value = self._c.as_sent(command, record)
            try:
                self._c.producer.produce(self._c.topic, value, key, callback(command.job_id))
            except DeliveryError as exc:
                with lock:
                    pending[0] -= 1
                    failures.append((command.job_id, exc))
        deadline = time.monotonic() + self.delivery_timeout_s
        while pending[0] > 0 and time.monotonic() < deadline:
            self._c.producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        if pending[0] > 0:
            raise self._c.failed(
                DeliveryError(
                    f"{pending[0]} of {len(commands)} commands not acknowledged within "
                    f"{self.delivery_timeout_s:.0f}s; is the broker reachable?",
                    code="_TIMED_OUT",
                )
            )
        if failures:
            if len(commands) == 1:
                raise self._c.failed(failures[0][1])
            raise self._c.failed(_batch_error(failures, len(commands)))
        log.debug("commands delivered", extra={"count": len(commands), "topic": self._c.topic})

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until nothing is queued (every method already waits for its own records)."""
        if not self._c.started:
            return
        remaining = self._c.producer.flush(
            self.delivery_timeout_s if timeout_s is None else timeout_s
        )
        if remaining:
            raise DeliveryError(f"{remaining} records still queued after flush", "_TIMED_OUT")

    def close(self) -> None:
        if self._c.started:
            self._c.producer.close()

    def __enter__(self) -> JobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncJobClient(_Client):
    """The asyncio client: the same methods as coroutines, resolved by delivery callbacks.

    A background thread polls the producer and hands each delivery report to the event loop
    (``loop.call_soon_threadsafe``), so awaiting a schedule never blocks the loop.
    """

    def _setup(self) -> None:
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._pending: set[asyncio.Future[Delivered]] = set()

    def _start(self) -> None:
        if self._poller is None:
            self._poller = threading.Thread(
                target=self._poll_loop, name="jobwheel-producer-poll", daemon=True
            )
            self._poller.start()

    def _poll_loop(self) -> None:
        producer = self._c.producer
        while not self._stop.is_set():
            producer.poll(0.1)

    async def schedule(self, job_id: str | None = None, **options: Any) -> str:
        """See :meth:`JobClient.schedule`."""
        return (await self.schedule_many([JobSpec(job_id=job_id, **options)]))[0]

    async def schedule_many(self, specs: Iterable[JobSpec | Mapping[str, Any]]) -> list[str]:
        now_ms = self._c.clock.now_ms()
        commands = [self._c.build_schedule(_spec(s), now_ms) for s in specs]
        # The roster is read from Kafka: off the event loop. Warnings raised in that thread
        # still reach the process's filters.
        await asyncio.to_thread(self._c.check_tasks, commands)
        await self._send(commands)
        return [c.job_id for c in commands]

    async def send(self, command: JobCommand) -> str:
        checked = self._c.check(command, self._c.clock.now_ms())
        await asyncio.to_thread(self._c.check_tasks, [checked])
        await self._send([checked])
        return command.job_id

    async def cancel(self, job_id: str, reason: str | None = None) -> str:
        return await self._control("cancel", job_id, reason)

    async def pause(self, job_id: str, reason: str | None = None) -> str:
        return await self._control("pause", job_id, reason)

    async def resume(self, job_id: str, reason: str | None = None) -> str:
        return await self._control("resume", job_id, reason)

    async def trigger(self, job_id: str, reason: str | None = None) -> str:
        return await self._control("trigger", job_id, reason)

    async def _control(self, kind: str, job_id: str, reason: str | None) -> str:
        command = self._c.build_control(kind, job_id, reason, self._c.clock.now_ms())
        await self._send([command])
        return command.command_id

    async def _send(self, commands: list[JobCommand]) -> None:
        encoded = [self._c.encode(c) for c in commands]
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._c.reach)  # a black-holed address takes its time
        self._start()
        waiting: list[tuple[str, asyncio.Future[Delivered]]] = []
        failures: list[tuple[str, DeliveryError]] = []
        deadline = time.monotonic() + self.delivery_timeout_s
        for command, record in zip(commands, encoded, strict=True):
            key, value = self._c.as_sent(command, record)
            future: asyncio.Future[Delivered] = loop.create_future()
            callback = _threadsafe_resolver(loop, future)
            try:
                while not self._c.producer.try_produce(self._c.topic, value, key, callback):
                    if time.monotonic() >= deadline:
                        raise DeliveryError("the local producer queue stayed full", "_QUEUE_FULL")
                    await asyncio.sleep(0.01)  # the poll thread drains the queue meanwhile
            except DeliveryError as exc:
                failures.append((command.job_id, exc))
                continue
            waiting.append((command.job_id, future))
            self._pending.add(future)
            future.add_done_callback(self._pending.discard)
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(f for _, f in waiting), return_exceptions=True),
                timeout=max(0.0, deadline - time.monotonic()),
            )
        except TimeoutError as exc:
            timed_out = DeliveryError(
                f"commands not acknowledged within {self.delivery_timeout_s:.0f}s; "
                "is the broker reachable?",
                code="_TIMED_OUT",
            )
            raise await loop.run_in_executor(None, self._c.failed, timed_out) from exc
        for (job_id, _), result in zip(waiting, results, strict=True):
            if isinstance(result, DeliveryError):
                failures.append((job_id, result))
            elif isinstance(result, BaseException):
                raise result
        if failures:
            error = failures[0][1] if len(commands) == 1 else _batch_error(failures, len(commands))
            raise await loop.run_in_executor(None, self._c.failed, error)

    async def flush(self) -> None:
        """Wait for every command sent so far to be acknowledged (or to fail)."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        self._stop.set()
        poller, self._poller = self._poller, None
        if poller is not None:
            await asyncio.get_running_loop().run_in_executor(None, poller.join)
        if self._c.started:
            await asyncio.get_running_loop().run_in_executor(None, self._c.producer.close)

    async def __aenter__(self) -> AsyncJobClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _threadsafe_resolver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Delivered]) -> Any:
    def resolve(err: DeliveryError | None, delivered: Delivered | None) -> None:
        if future.done():
            return
        if err is not None:
            future.set_exception(err)
        else:
            future.set_result(delivered)  # type: ignore[arg-type]

    def callback(err: DeliveryError | None, delivered: Delivered | None) -> None:
        try:
            loop.call_soon_threadsafe(resolve, err, delivered)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            log.debug("delivery report after the event loop closed")

    return callback


__all__ = ["AsyncJobClient", "JobClient", "JobSpec"]
