"""The one exception tree of jobwheel. Messages say what was wrong and what to do."""

from __future__ import annotations

CLIP_CHARS = 60


def clip(value: object, limit: int = CLIP_CHARS) -> str:
    """``repr`` of a value for an error message, cut to its first ``limit`` characters + "…".

    Messages echo what was wrong so the user can find it, but a 10,000-character task name or a
    300 KB document echoed whole turns one error line into a wall of text (and a log flood).
    """
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}…"
    text = repr(value)
    return text if len(text) <= limit + 2 else f"{text[: limit + 2]}…"


class JobwheelError(Exception):
    """Root of every error jobwheel raises on purpose."""


class ConfigError(JobwheelError):
    """A setting or the environment is unusable (missing Java, taken port, bad env value)."""


class BrokerError(JobwheelError):
    """Kafka said no. ``code`` is librdkafka's error code name when there is one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class BrokerConnectionError(BrokerError):
    """The broker could not be reached."""


class DeliveryError(BrokerError):
    """A produced record was not acknowledged by the broker."""


class TopicMismatchError(BrokerError):
    """An existing topic does not match its definition (e.g. wrong partition count)."""


class FencedError(BrokerError):
    """This process can no longer commit for its partitions: a newer owner fenced it, or its
    transactional producer hit a fatal error. Drop the partitions' uncommitted state, replace the
    producer and claim them again."""


class TransactionAbortedError(BrokerError):
    """The current transaction cannot commit: abort it and process the batch again from the
    last committed state."""


class ValidationError(JobwheelError, ValueError):
    """A job request is invalid. ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnservedTaskError(ValidationError):
    """Refused before sending: no live worker serves the job's task (or none is live, or the
    workers cannot be read), and the caller asked for a worker to be there."""

    def __init__(self, message: str) -> None:
        super().__init__("task", message)


class SchemaDecodeError(JobwheelError):
    """Bytes that are not a message of any known schema version. Keeps the raw bytes."""

    def __init__(self, message: str, raw: bytes | None = None) -> None:
        super().__init__(message)
        self.raw = raw


class SchemaRegistryError(JobwheelError):
    """The Schema Registry failed (unreachable, refused a schema). Transient: retry the record,
    do not dead-letter it (an unknown schema id is a :class:`SchemaDecodeError` instead)."""


class StateError(JobwheelError):
    """Scheduler state is unusable (unknown version, corrupt record)."""


class RecordTooLargeError(StateError):
    """A job record would encode past the size its changelog can carry: the change that made
    it so is refused, never written to the local state alone."""


class TaskError(JobwheelError):
    """A task is unknown or misdeclared."""


class StoreError(JobwheelError):
    """The status store (ClickHouse) is unreachable, locked by another process, or its schema
    could not be migrated."""


class QueryError(StoreError):
    """A status query was refused (not read-only) or failed in ClickHouse; the message is
    ClickHouse's own, so the caller can fix the SQL."""


class QueryBusyError(StoreError):
    """Every connection for ad-hoc queries is taken: try again shortly (HTTP 429). Refused at
    once rather than queued, so waiting queries cannot take the threads other requests need."""


class Retry(JobwheelError):
    """Raised by a task to ask for a retry after ``delay_ms`` (None: the task's backoff)."""

    def __init__(self, delay_ms: float | None = None, reason: str | None = None) -> None:
        # Checked here, in the task's code, so a wrong type fails the task with a message
        # that says so (a number is cut to whole milliseconds in range by the worker).
        if delay_ms is not None and (
            isinstance(delay_ms, bool) or not isinstance(delay_ms, int | float)
        ):
            raise TypeError(
                f"Retry(delay_ms=...) takes a number of milliseconds or None, got "
                f"{type(delay_ms).__name__} {clip(delay_ms)}"
            )
        super().__init__(reason or "retry requested")
        self.delay_ms = delay_ms


class JobFailedError(JobwheelError):
    """A job waited for (``JobClient.wait``) ended without a result: its run DEAD, the job
    CANCELLED, its fire MISSED, or its ScheduleJob REJECTED. ``state`` says which, ``error``
    is the task's last error (if a run failed), ``reason`` the scheduler's."""

    def __init__(
        self, job_id: str, state: str, reason: str | None = None, error: str | None = None
    ) -> None:
        # The scheduler's reason for a DEAD run quotes the task's error; said twice, it made
        # one failure read like two.
        said = error is not None and reason is not None and error in reason
        last = f"last error: {error}" if error and not said else None
        why = "; ".join(x for x in (reason, last) if x)
        super().__init__(f"job {job_id} ended {state}" + (f": {why}" if why else ""))
        self.job_id = job_id
        self.state = state
        self.reason = reason
        self.error = error


class WaitTimeoutError(JobwheelError, TimeoutError):
    """``JobClient.wait`` gave up: the job had not finished within the timeout (it may still)."""


class UnknownTaskWarning(UserWarning):
    """A job was scheduled for a task no live worker serves (by the workers' announcements on
    the workers topic, or ``JobClient(known_tasks=...)``): its runs will end DEAD, or wait for
    a worker when none is live. A warning, not an error, by default: a worker may be about to
    start. ``JobClient(task_check="refuse")`` (``submit --require-worker``, the API's
    ``?require_worker=true``) refuses instead (:class:`UnservedTaskError`);
    ``warnings.simplefilter("error", UnknownTaskWarning)`` also makes it one."""
