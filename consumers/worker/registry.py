"""Tasks by name: the only way a run reaches code.

A Run names its task with a plain string. The worker looks that string up here and nowhere else:
no pickled callables, no ``module:function`` import paths taken from a message. Which code a
worker can run is decided by the operator who starts it (``jobwheel worker --tasks MODULE``
imports the modules whose ``@task`` decorators fill the registry), never by whoever can write to
the runs topic.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from jobwheel.consumers.worker.backoff import DEFAULT_BACKOFF, Backoff
from jobwheel.errors import TaskError, ValidationError
from jobwheel.schemas import validation
from jobwheel.schemas.topics import DEFAULT_QUEUE

F = TypeVar("F", bound=Callable[..., Any])

# Same rule as the ScheduleJob.task field of the Avro contract.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A registered task: the function and its execution policy."""

    name: str
    fn: Callable[..., Any]
    timeout_ms: int | None = None
    max_attempts: int | None = None
    backoff: Backoff = DEFAULT_BACKOFF
    #: The queue (worker pool) this task is served on: a worker started with ``--tasks`` and
    #: no ``--queue`` serves the queues of its tasks.
    queue: str = DEFAULT_QUEUE

    #: Seen through decorators that keep ``functools.wraps`` and on objects with an
    #: ``async def __call__``: called as sync, either would return a coroutine unrun.
    #: Decided once here (the property it was cost every run an inspection).
    is_async: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        fn = self.fn
        is_async = (
            inspect.iscoroutinefunction(fn)
            or inspect.iscoroutinefunction(inspect.unwrap(fn))
            or (not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__))
        )
        object.__setattr__(self, "is_async", is_async)


def _to_ms(value: timedelta | float | int | None, what: str) -> int | None:
    """Timeouts may be given as a timedelta or as seconds (the unit Python users expect)."""
    if value is None:
        return None
    ms = int(value.total_seconds() * 1000) if isinstance(value, timedelta) else int(value * 1000)
    if ms <= 0:
        raise TaskError(f"{what} must be positive, got {value!r}")
    return ms


class TaskRegistry:
    """Name -> :class:`TaskSpec`. Thread-safe, because modules may be imported from any thread."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskSpec] = {}
        self._lock = threading.Lock()

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        timeout: timedelta | float | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        queue: str = DEFAULT_QUEUE,
    ) -> TaskSpec:
        """Register ``fn`` under ``name``; a second, different function for a name is refused."""
        try:
            validation.queue(queue)
        except ValidationError as exc:
            raise TaskError(f"task {name!r}: {exc}") from None
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise TaskError(
                f"task name {name!r} is invalid: use 1..200 letters, digits, '_', '-', '.', ':'"
            )
        if not callable(fn):
            raise TaskError(f"task {name!r}: {fn!r} is not callable")
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise TaskError(f"task {name!r}: generator functions cannot be tasks; return a value")
        if max_attempts is not None and max_attempts < 1:
            raise TaskError(f"task {name!r}: max_attempts must be >= 1, got {max_attempts}")
        spec = TaskSpec(
            name=name,
            fn=fn,
            timeout_ms=_to_ms(timeout, f"task {name!r}: timeout"),
            max_attempts=max_attempts,
            backoff=backoff or DEFAULT_BACKOFF,
            queue=queue,
        )
        with self._lock:
            existing = self._tasks.get(name)
            if existing is not None and not _same_function(existing.fn, fn):
                raise TaskError(
                    f"task name {name!r} is already registered to "
                    f"{_qualname(existing.fn)}; pick another name for {_qualname(fn)}"
                )
            self._tasks[name] = spec
        return spec

    def task(
        self,
        name: str,
        *,
        timeout: timedelta | float | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        queue: str = DEFAULT_QUEUE,
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`register`; returns the function unchanged."""

        def decorate(fn: F) -> F:
            self.register(
                name, fn, timeout=timeout, max_attempts=max_attempts, backoff=backoff, queue=queue
            )
            return fn

        return decorate

    def get(self, name: str) -> TaskSpec:
        try:
            return self._tasks[name]
        except KeyError:
            raise TaskError(
                f"unknown task {name!r}: not registered in this worker; start the worker with "
                f"--tasks naming the module that defines it (registered: {self.describe()})"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def queues(self) -> list[str]:
        """The queues the registered tasks name, each once, in the order first named."""
        return list(dict.fromkeys(spec.queue for spec in self._tasks.values()))

    def describe(self, limit: int = 20) -> str:
        names = self.names()
        shown = ", ".join(names[:limit]) or "none"
        return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """True for the same object, or the same definition seen again (a module imported twice,
    e.g. once as ``__main__``-adjacent path and once by name), which must not be an error."""
    return a is b or _qualname(a) == _qualname(b)


default_registry = TaskRegistry()


def task(
    name: str,
    *,
    timeout: timedelta | float | None = None,
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    registry: TaskRegistry | None = None,
    queue: str = DEFAULT_QUEUE,
) -> Callable[[F], F]:
    """Register a sync or async function as the task ``name``.

    ``timeout`` (timedelta or seconds) applies when the run does not set its own; ``max_attempts``
    caps the run's attempts (the lower of the two wins); ``backoff`` sets the retry delays.

        @task("send_email", timeout=30, max_attempts=5)
        async def send_email(to: str, subject: str) -> None: ...

    ``queue`` names the worker pool that serves it (``@task("reports.build",
    queue="reports")``): ``jobwheel worker --tasks MODULE`` without ``--queue`` serves the
    queues its tasks name. It does not route runs: the job's own queue does (``queue=`` of
    ``JobClient.schedule``, ``jobwheel submit --queue``).
    """
    return (registry if registry is not None else default_registry).task(
        name, timeout=timeout, max_attempts=max_attempts, backoff=backoff, queue=queue
    )
