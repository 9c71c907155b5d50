"""Run one attempt of one task and describe what happened as an :class:`Outcome`.

This is the part of the worker that knows nothing about Kafka: give it a Run, get back the fields
of the SUCCEEDED or FAILED status event. It decides, per the contract with the scheduler (which
owns retries), whether a failure is worth another attempt and after how long:

* ``retry_delay_ms`` is the task's backoff when the error is retryable and
  ``attempt < min(run.max_attempts, task.max_attempts)``; ``None`` tells the scheduler "DEAD".
* A task may raise :class:`jobwheel.errors.Retry` to choose its own delay.
* Being over the time limit (the run's ``timeout_ms``, else the task's) is a retryable failure.
* Problems no retry can fix (unknown task, arguments that are not JSON or do not fit the
  function's signature) fail with ``retry_delay_ms = None``.

Sync functions run in a thread pool. Python cannot stop a thread, so a sync task over its limit
is reported FAILED at the deadline while its thread runs on; :attr:`Outcome.lingering` hands the
thread's future to the pool, which keeps the concurrency slot taken until it really returns.
An async task that swallows its cancellation is treated the same way, a little after its limit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobwheel.consumers.worker.backoff import RandomSource
from jobwheel.consumers.worker.context import RunContext, reset_context, set_context
from jobwheel.consumers.worker.registry import TaskRegistry, TaskSpec
from jobwheel.errors import Retry, TaskError
from jobwheel.schemas.models import Run, State
from jobwheel.schemas.validation import MAX_DURATION_MS

log = logging.getLogger(__name__)

RESULT_LIMIT_BYTES = 4096
ERROR_LIMIT_CHARS = 2048


@dataclass(frozen=True, slots=True)
class Outcome:
    """The terminal result of one attempt: the payload of its SUCCEEDED or FAILED event."""

    state: State
    duration_ms: int
    result_json: str | None = None
    error: str | None = None
    reason: str | None = None
    retry_delay_ms: int | None = None
    lingering: concurrent.futures.Future[Any] | asyncio.Future[Any] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        # The texts come from the task's code (its exception, its result, its arguments) and
        # go into a UTF-8 record, which cannot carry a lone surrogate: an undecodable byte of
        # a file name, as os.fsdecode gives it, made the verdict's encoding fail and the run
        # never finished, holding back its partition's offsets.
        # The error and reason (a Retry's reason included) are also cut, so the verdict fits
        # in a record; result_json is cut as JSON by result_to_json.
        for name, limit in (
            ("result_json", None),
            ("error", ERROR_LIMIT_CHARS),
            ("reason", ERROR_LIMIT_CHARS),
        ):
            text = getattr(self, name)
            if text is None:
                continue
            clean = text if text.isascii() else utf8_text(text)
            if limit is not None and len(clean) > limit:
                clean = _cut(clean, limit)
            if clean is not text:
                object.__setattr__(self, name, clean)
        # A Retry's delay comes from the task: a float (2.5 * 1000) or a number past the
        # largest duration made the verdict impossible to encode, and the run never ended.
        delay = self.retry_delay_ms
        if delay is not None and (type(delay) is not int or not 0 <= delay <= MAX_DURATION_MS):
            object.__setattr__(self, "retry_delay_ms", retry_delay(delay))

    @property
    def retryable(self) -> bool:
        return self.state is State.FAILED and self.retry_delay_ms is not None


def retry_delay(delay: float) -> int:
    """A retry delay the contract can carry: whole milliseconds (rounded up) within
    ``0..MAX_DURATION_MS`` (the longest duration any schedule may name)."""
    if delay != delay or delay <= 0:  # NaN or none: at once
        return 0
    if delay >= MAX_DURATION_MS:
        return MAX_DURATION_MS
    return math.ceil(delay)


def utf8_text(text: str) -> str:
    """``text`` with every character UTF-8 cannot encode (a lone surrogate) as its escape
    (``\\udcff``): readable in an error, and in a JSON text the escape JSON itself uses, so
    a result reads back as the same value."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _text(exc: BaseException) -> str:
    """``str(exc)``; an exception whose ``str()`` itself raises still gets a text: the
    verdict must be sent."""
    try:
        return str(exc)
    except Exception as err:  # the task's own __str__: whatever it raises
        return f"<str() of this exception raised {type(err).__name__}>"


def _cut(text: str, limit: int = ERROR_LIMIT_CHARS) -> str:
    """``text`` cut to ``limit`` characters (events are not log files, and a record over the
    broker's size limit could never be sent)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_error(exc: BaseException, limit: int = ERROR_LIMIT_CHARS) -> str:
    """``"Type: message"``, cut to ``limit`` characters."""
    message = _text(exc)
    return _cut(f"{type(exc).__name__}: {message}" if message else type(exc).__name__, limit)


def _describe(result: Any) -> str:
    """``repr(result)``, or the type's name when even that raises (the task's own code)."""
    try:
        return repr(result)
    except Exception as err:
        return f"<{type(result).__name__} object: repr() raised {type(err).__name__}>"


def result_to_json(result: Any, limit: int = RESULT_LIMIT_BYTES) -> str:
    """The task's return value as JSON of at most ``limit`` UTF-8 bytes.

    A result too large is replaced by ``{"truncated": true, "bytes": N, "head": "..."}`` rather
    than cut mid-token, so whatever reads ``result_json`` can still parse it.
    """
    if result is None:  # most tasks return nothing
        return "null"
    try:
        text = json.dumps(result, default=str, ensure_ascii=False, separators=(",", ":"))
    except Exception:  # a circular structure, an int past str()'s digits, a raising __str__
        text = json.dumps(_describe(result), ensure_ascii=False)
    text = utf8_text(text)  # a lone surrogate in a string: its JSON escape (see Outcome)
    size = len(text.encode("utf-8"))
    if size <= limit:
        return text
    head = text[: max(0, limit - 64)]
    while True:
        wrapped = json.dumps(
            {"truncated": True, "bytes": size, "head": head},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        if len(wrapped.encode("utf-8")) <= limit or not head:
            return wrapped
        head = head[: int(len(head) * 0.8)]


def decode_args(args_json: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A JSON object becomes keyword arguments, a list positional ones, null/empty none at all,
    and any other value the single positional argument."""
    value = json.loads(args_json) if args_json.strip() else None
    if value is None:
        return (), {}
    if isinstance(value, dict):
        return (), value
    if isinstance(value, list):
        return tuple(value), {}
    return (value,), {}


class _Signature:
    """A task function's signature, with a quick yes for the usual call (keyword arguments
    only) that ``Signature.bind`` answers in about ten times the time."""

    __slots__ = ("signature", "_names", "_required", "_var_keyword", "_quick")

    def __init__(self, signature: inspect.Signature | None) -> None:
        self.signature = signature
        params = list(signature.parameters.values()) if signature is not None else []
        kinds = {p.kind for p in params}
        by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self._names = frozenset(p.name for p in params if p.kind in by_name)
        self._required = frozenset(
            p.name for p in params if p.kind in by_name and p.default is inspect.Parameter.empty
        )
        self._var_keyword = inspect.Parameter.VAR_KEYWORD in kinds
        # Positional-only parameters make keyword binding subtle: leave those to bind().
        self._quick = inspect.Parameter.POSITIONAL_ONLY not in kinds

    def accepts_keywords(self, kwargs: dict[str, Any]) -> bool:
        """True when ``fn(**kwargs)`` certainly binds; False means "ask bind()"."""
        if not self._quick or not self._required.issubset(kwargs):
            return False
        return self._var_keyword or self._names.issuperset(kwargs)


class _NotRetryable(Exception):
    """A failure no further attempt can fix; carries the error text and the reason."""

    def __init__(self, error: str, reason: str) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Prepared:
    """A run that can execute: its task and decoded arguments, checked against the signature."""

    spec: TaskSpec
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    timeout_ms: int | None


class Executor:
    """Executes runs with the tasks of one registry.

    :meth:`execute` does everything for one run. The worker pool uses the parts separately
    (:meth:`prepare`, then :meth:`run_async` on its event loop or :meth:`call_sync` in one of
    its threads) so that a fast task costs no extra asyncio task or thread hand-off.

    :param threads: the pool sync tasks run in; size it to the worker's concurrency.
    :param rng: the random source of backoff jitter (seed it in tests).
    """

    def __init__(
        self,
        registry: TaskRegistry,
        threads: concurrent.futures.ThreadPoolExecutor,
        *,
        rng: RandomSource | None = None,
        result_limit_bytes: int = RESULT_LIMIT_BYTES,
    ) -> None:
        self.registry = registry
        self._threads = threads
        self._rng = rng or random.Random()
        self._result_limit = result_limit_bytes
        self._running_threads: set[concurrent.futures.Future[Any]] = set()
        self._signatures: dict[Callable[..., Any], _Signature] = {}

    @property
    def busy_threads(self) -> int:
        """Sync task functions still running, including ones whose run timed out or was
        handed back (a thread cannot be stopped, only waited for)."""
        return sum(1 for f in list(self._running_threads) if not f.done())

    def track_thread(self, future: concurrent.futures.Future[Any]) -> None:
        """Count ``future`` (a sync task's thread) in :attr:`busy_threads` until it is done."""
        self._running_threads.add(future)
        future.add_done_callback(self._running_threads.discard)

    async def execute(self, run: Run, heartbeat: Callable[[], None] = lambda: None) -> Outcome:
        """Run ``run`` to a terminal outcome. Never raises for task failures; only
        ``asyncio.CancelledError`` (the worker is shutting down) propagates."""
        started = time.monotonic()
        prepared = self.prepare(run, started)
        if isinstance(prepared, Outcome):
            return prepared
        if prepared.spec.is_async:
            return await self.run_async(run, prepared, heartbeat, started)
        token = set_context(RunContext(run=run, heartbeat=heartbeat))
        try:
            ctx = contextvars.copy_context()
        finally:
            reset_context(token)
        thread_future = self._threads.submit(ctx.run, self.call_sync, run, prepared, started)
        self.track_thread(thread_future)
        timeout_ms = prepared.timeout_ms
        timer: asyncio.Timeout | None = None
        try:
            async with asyncio.timeout(timeout_ms / 1000 if timeout_ms else None) as timer:
                return await asyncio.wrap_future(thread_future)
        except TimeoutError:
            if timer is not None and timer.expired():
                return self.timed_out(run, prepared, _elapsed_ms(started), thread_future)
            raise

    def prepare(self, run: Run, started: float) -> Prepared | Outcome:
        """The task and arguments of ``run``, or the FAILED outcome of a run that cannot start
        (unknown task, arguments that are not JSON or do not fit): it never executes."""
        try:
            spec = self.registry.get(run.task)
        except TaskError as exc:
            return Outcome(
                State.FAILED,
                _elapsed_ms(started),
                error=format_error(exc),
                # Short: the error says what is missing and how to start the worker, and the
                # scheduler's DEAD reason adds "not retried" (this said each twice).
                reason=f"unknown task {run.task!r} on queue {run.queue!r}",
            )
        try:
            args, kwargs = self._arguments(spec, run)
        except _NotRetryable as exc:
            return Outcome(State.FAILED, _elapsed_ms(started), error=exc.error, reason=exc.reason)
        timeout_ms = run.timeout_ms if run.timeout_ms is not None else spec.timeout_ms
        return Prepared(spec, args, kwargs, timeout_ms)

    async def run_async(
        self, run: Run, prepared: Prepared, heartbeat: Callable[[], None], started: float
    ) -> Outcome:
        """Await an async task in the calling asyncio task, within its time limit."""
        spec = prepared.spec
        token = set_context(RunContext(run=run, heartbeat=heartbeat))
        timer: asyncio.Timeout | None = None
        try:
            if prepared.timeout_ms:
                async with asyncio.timeout(prepared.timeout_ms / 1000) as timer:
                    result = await spec.fn(*prepared.args, **prepared.kwargs)
            else:
                result = await spec.fn(*prepared.args, **prepared.kwargs)
        except TimeoutError as exc:
            if timer is not None and timer.expired():
                return self.timed_out(run, prepared, _elapsed_ms(started), None)
            return self._failed(run, spec, _elapsed_ms(started), error=format_error(exc))
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the worker cancelled it (hand-back, close): the pool decides
            # The task's own code raised it (an awaited future someone else cancelled): a
            # failure like any other, or the run would never get its verdict.
            return self._from_exception(run, spec, _elapsed_ms(started), exc)
        # Whatever else the task raises is its failure: sys.exit(), KeyboardInterrupt (the
        # worker's signals are handled by its loop, so neither comes from outside the task),
        # BaseException subclasses of test runners and other frameworks, exception groups.
        except BaseException as exc:
            return self._from_exception(run, spec, _elapsed_ms(started), exc)
        finally:
            reset_context(token)
        return self._succeeded(result, _elapsed_ms(started))

    def call_sync(self, run: Run, prepared: Prepared, started: float) -> Outcome:
        """Call a sync task in this thread (the caller's contextvars must hold the run's
        context). Time limits are the caller's: a thread cannot be interrupted."""
        spec = prepared.spec
        try:
            result = spec.fn(*prepared.args, **prepared.kwargs)
        except BaseException as exc:  # the task's failure, whatever it raised (see run_async)
            return self._from_exception(run, spec, _elapsed_ms(started), exc)
        if inspect.isawaitable(result):
            # An async function behind a plain decorator (or an object with an async
            # __call__ the registry could not see): its body never ran. Not a success.
            close = getattr(result, "close", None)
            if callable(close):
                close()  # no "coroutine was never awaited" warning: the verdict says it
            return Outcome(
                State.FAILED,
                _elapsed_ms(started),
                error=f"TaskError: task {spec.name!r} returned {type(result).__name__!s} "
                "instead of running",
                reason=f"task {spec.name!r} is a plain function that returned an awaitable: its "
                "body did not run; declare it `async def` (or keep functools.wraps on its "
                "decorator); not retried",
            )
        return self._succeeded(result, _elapsed_ms(started))

    def timed_out(
        self,
        run: Run,
        prepared: Prepared,
        duration_ms: int,
        thread: concurrent.futures.Future[Any] | asyncio.Future[Any] | None,
    ) -> Outcome:
        """FAILED for being over the time limit; ``thread``: a sync task's thread, or an async
        task's asyncio task that ignored its cancellation, still running."""
        lingering = thread if thread is not None and not thread.done() else None
        if lingering is not None:
            log.warning(
                "task over its timeout keeps its slot until it returns",
                extra={"run_id": run.run_id, "attempt": run.attempt, "task": run.task},
            )
        return self._failed(
            run,
            prepared.spec,
            duration_ms,
            error=f"TimeoutError: task {prepared.spec.name!r} exceeded its timeout of "
            f"{prepared.timeout_ms} ms",
            reason="timed out",
            lingering=lingering,
        )

    def _succeeded(self, result: Any, duration_ms: int) -> Outcome:
        return Outcome(
            State.SUCCEEDED, duration_ms, result_json=result_to_json(result, self._result_limit)
        )

    def _from_exception(
        self, run: Run, spec: TaskSpec, duration_ms: int, exc: BaseException
    ) -> Outcome:
        if isinstance(exc, Retry):
            return self._failed(
                run,
                spec,
                duration_ms,
                error=format_error(exc),
                reason=f"task asked for a retry: {_text(exc)}",
                delay_ms=exc.delay_ms,
            )
        return self._failed(run, spec, duration_ms, error=format_error(exc))

    def failure(
        self, run: Run, prepared: Prepared, duration_ms: int, exc: BaseException
    ) -> Outcome:
        """The outcome of ``exc`` raised by the task's code (the retry policy applied)."""
        return self._from_exception(run, prepared.spec, duration_ms, exc)

    def _signature(self, spec: TaskSpec) -> _Signature:
        """Cached: inspecting a function costs more than a fast task's whole execution."""
        try:
            return self._signatures[spec.fn]
        except KeyError:
            pass
        try:
            signature: inspect.Signature | None = inspect.signature(spec.fn)
        except (TypeError, ValueError):
            signature = None
        self._signatures[spec.fn] = _Signature(signature)
        return self._signatures[spec.fn]

    def _arguments(self, spec: TaskSpec, run: Run) -> tuple[tuple[Any, ...], dict[str, Any]]:
        try:
            args, kwargs = decode_args(run.args_json)
        except ValueError as exc:
            raise _NotRetryable(
                format_error(exc), "args_json is not valid JSON; not retried"
            ) from None
        signature = self._signature(spec)
        if signature.signature is None:  # some builtins have no signature: the call decides
            return args, kwargs
        if not args and signature.accepts_keywords(kwargs):
            return args, kwargs
        try:
            signature.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise _NotRetryable(
                format_error(exc),
                f"arguments do not match the signature of task {spec.name!r}"
                f"{signature.signature}; not retried",
            ) from None
        return args, kwargs

    def _failed(
        self,
        run: Run,
        spec: TaskSpec,
        duration_ms: int,
        *,
        error: str,
        reason: str = "task raised an exception",
        delay_ms: int | None = None,
        lingering: concurrent.futures.Future[Any] | asyncio.Future[Any] | None = None,
    ) -> Outcome:
        limit = run.max_attempts
        if spec.max_attempts is not None:
            limit = min(limit, spec.max_attempts)
        if run.attempt >= limit:
            retry = None
            reason = f"{reason}; attempts exhausted ({run.attempt} of {limit})"
        else:
            retry = (
                retry_delay(delay_ms)
                if delay_ms is not None
                else spec.backoff.delay_ms(run.attempt, self._rng)
            )
            reason = f"{reason}; retry in {retry} ms (attempt {run.attempt} of {limit})"
        return Outcome(
            State.FAILED,
            duration_ms,
            error=error,
            reason=reason,
            retry_delay_ms=retry,
            lingering=lingering,
        )


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
