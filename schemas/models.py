"""Typed values of the Avro contract. The codec (``jobwheel.schemas.codec``) turns these into bytes
and back.

Field names and meanings follow the ``.avsc`` files in ``schemas/avro/``; the schema files are
the source of truth and ``tests/unit/test_models_match_schemas.py`` keeps the two in step.
All times are epoch milliseconds UTC (``*_ms``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TypeVar

from jobwheel.schemas.topics import DEFAULT_QUEUE

_T = TypeVar("_T")

__all__ = ["DEFAULT_QUEUE"]  # re-exported: the queue of commands and runs that name none


def _quick_init(cls: type[_T]) -> type[_T]:
    """Give a frozen slots dataclass an ``__init__`` that fills its slots through their own
    descriptors. The dataclass's own ``__init__`` of a frozen class goes through
    ``object.__setattr__`` once per field, which made building a 20-field status event cost
    three times as much; the scheduler builds four models per job and decodes two. Same
    signature, defaults and behaviour (these models have no ``__post_init__`` and no default
    factories; a class that has either keeps the dataclass's own)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if hasattr(cls, "__post_init__") or any(
        f.default_factory is not dataclasses.MISSING or not f.init or f.kw_only for f in fields
    ):
        return cls
    env: dict[str, object] = {}
    params, body = ["self"], []
    for f in fields:
        env[f"set_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            env[f"default_{f.name}"] = f.default
            params.append(f"{f.name}=default_{f.name}")
        body.append(f"    set_{f.name}(self, {f.name})")
    source = f"def __init__({', '.join(params)}):\n" + ("\n".join(body) or "    pass")
    exec(source, env)  # noqa: S102 - source built from the class's own field names
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[misc]
    return cls


class ConcurrencyPolicy(enum.StrEnum):
    """Kubernetes CronJob ``concurrencyPolicy``."""

    ALLOW = "ALLOW"
    FORBID = "FORBID"
    REPLACE = "REPLACE"


class State(enum.StrEnum):
    """Status event states. An event without a run id is about the job (SCHEDULED, REJECTED,
    PAUSED, RESUMED, CANCELLED, COMPLETED, DEAD), one with a run id about that run (DISPATCHED
    .. STALE, and CANCELLED/DEAD of a run). A job's own state is one of SCHEDULED, PAUSED,
    COMPLETED, DEAD, CANCELLED (README, "Job states"); REJECTED answers a command."""

    SCHEDULED = "SCHEDULED"
    REJECTED = "REJECTED"
    PAUSED = "PAUSED"
    RESUMED = "RESUMED"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
    DISPATCHED = "DISPATCHED"
    STARTED = "STARTED"
    HEARTBEAT = "HEARTBEAT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    RETRYING = "RETRYING"
    DEAD = "DEAD"
    MISSED = "MISSED"
    SKIPPED = "SKIPPED"
    STALE = "STALE"


# --- triggers -----------------------------------------------------------------------------


@_quick_init
@dataclass(frozen=True, slots=True)
class Now:
    pass


@_quick_init
@dataclass(frozen=True, slots=True)
class At:
    at_ms: int


@_quick_init
@dataclass(frozen=True, slots=True)
class After:
    delay_ms: int


@_quick_init
@dataclass(frozen=True, slots=True)
class Every:
    interval_ms: int
    start_at_ms: int | None = None


@_quick_init
@dataclass(frozen=True, slots=True)
class Cron:
    expression: str
    timezone: str = "UTC"


Trigger = Now | At | After | Every | Cron

HANDBACK_REASON = "worker shutdown"
"""The ``reason`` of a FAILED event by which a stopping worker hands a run back unfinished.
The scheduler dispatches it again at once and does not count the attempt against
``max_attempts`` (the run did not fail; its worker went away)."""


# --- commands -----------------------------------------------------------------------------


@_quick_init
@dataclass(frozen=True, slots=True)
class ScheduleJob:
    task: str
    trigger: Trigger
    args_json: str = "{}"
    max_attempts: int = 3
    timeout_ms: int | None = None
    visibility_timeout_ms: int = 30_000
    starting_deadline_ms: int | None = None
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    idempotency_key: str | None = None
    #: job_command.v4: the queue (worker pool) its runs go to; older commands read "default"
    queue: str = DEFAULT_QUEUE


@_quick_init
@dataclass(frozen=True, slots=True)
class CancelJob:
    reason: str | None = None


@_quick_init
@dataclass(frozen=True, slots=True)
class PauseJob:
    reason: str | None = None


@_quick_init
@dataclass(frozen=True, slots=True)
class ResumeJob:
    reason: str | None = None


@_quick_init
@dataclass(frozen=True, slots=True)
class TriggerJob:
    reason: str | None = None


def trigger_run_id(job_id: str, issued_at_ms: int) -> str:
    """The run a :class:`TriggerJob` asks for, named by the trigger's issue time: the name the
    scheduler gives it (``streams/rules/commands.py``), so whoever sends a trigger knows its
    run before the scheduler acts."""
    return f"{job_id}@trigger-{issued_at_ms}"


@_quick_init
@dataclass(frozen=True, slots=True)
class ReplayRun:
    """Dispatch a DEAD run again (job_command.v3): the same run id, its next attempt.

    ``task`` .. ``visibility_timeout_ms`` are the dead run's own (from its dead-letter record);
    the scheduler uses them only when it no longer has the job (finished jobs are forgotten
    after ``JOBWHEEL_JOB_RETENTION_MS``); while it has the job, the job's current definition
    runs, so a job scheduled again with a fix (a corrected task name) replays with the fix.
    """

    run_id: str
    scheduled_time_ms: int
    attempt: int
    task: str
    args_json: str = "{}"
    max_attempts: int = 3
    timeout_ms: int | None = None
    visibility_timeout_ms: int = 30_000
    reason: str | None = None
    queue: str = DEFAULT_QUEUE  # job_command.v4


CommandBody = ScheduleJob | CancelJob | PauseJob | ResumeJob | TriggerJob | ReplayRun


@_quick_init
@dataclass(frozen=True, slots=True)
class JobCommand:
    command_id: str
    job_id: str
    issued_at_ms: int
    body: CommandBody


# --- runs and status ----------------------------------------------------------------------


@_quick_init
@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    job_id: str
    task: str
    args_json: str
    seq: int
    scheduled_time_ms: int
    dispatched_at_ms: int
    attempt: int
    max_attempts: int
    timeout_ms: int | None
    visibility_timeout_ms: int
    deadline_ms: int
    partition: int
    fencing_token: int
    #: run.v2: the queue it was dispatched to (its runs topic); older runs read "default"
    queue: str = DEFAULT_QUEUE


@_quick_init
@dataclass(frozen=True, slots=True)
class StatusEvent:
    event_id: str
    job_id: str
    state: State
    event_time_ms: int
    source: str
    run_id: str | None = None
    seq: int = 0
    attempt: int = 0
    task: str | None = None
    scheduled_time_ms: int | None = None
    worker: str | None = None
    error: str | None = None
    reason: str | None = None
    result_json: str | None = None
    duration_ms: int | None = None
    next_fire_ms: int | None = None
    deadline_ms: int | None = None
    retry_delay_ms: int | None = None
    #: status_event.v2: a quick run's start, carried by its terminal event instead of a STARTED
    started_ms: int | None = None
    #: status_event.v3: on a SCHEDULED event, the job's definition as JSON (the console shows
    #: it and its next fires); see :func:`jobwheel.schemas.models.spec_document`
    spec_json: str | None = None
    #: status_event.v4: the queue (worker pool) of the job or run (None from older writers)
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class StatusBatch:
    """Status events of one partition carried by one record (``status_batch.v1``): each item
    is a whole encoded :class:`StatusEvent` message, so the events keep their own schema
    versions and a reader decodes them as it decodes a record of one event."""

    events: tuple[bytes, ...]


def spec_document(spec: ScheduleJob) -> dict[str, object]:
    """A ScheduleJob as the plain document a SCHEDULED event carries (``spec_json``): the
    trigger as ``{"type": "Cron", "expression": ..., "timezone": ...}`` (``Now``, ``At``,
    ``After``, ``Every`` likewise, with their fields), the other fields by name."""
    trigger: dict[str, object] = {"type": type(spec.trigger).__name__}
    for name in spec.trigger.__slots__:  # type: ignore[union-attr]
        trigger[name] = getattr(spec.trigger, name)
    return {
        "task": spec.task,
        "trigger": trigger,
        "args_json": spec.args_json,
        "max_attempts": spec.max_attempts,
        "timeout_ms": spec.timeout_ms,
        "visibility_timeout_ms": spec.visibility_timeout_ms,
        "starting_deadline_ms": spec.starting_deadline_ms,
        "concurrency_policy": spec.concurrency_policy.value,
        "idempotency_key": spec.idempotency_key,
        "queue": spec.queue,
    }
