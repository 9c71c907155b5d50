"""The status API's request and response bodies (pydantic): what its OpenAPI document shows.

``POST /jobs`` takes :data:`ScheduleRequest`, made from the options of
:class:`~jobwheel.producers.spec.JobSpec` (the one definition of the SDK, the CLI and this API).
"""

from __future__ import annotations

from dataclasses import MISSING
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, create_model

from jobwheel.schemas import deadletter

# Strict: JSON true is not 1 ms, 1e20 is not an integer, "5" is not a number.
Duration = StrictStr | StrictInt | None
#: The dead-letter kinds, for the descriptions of the fields and parameters that take one.
KINDS_DOC = ", ".join(deadletter.KINDS)
_DURATION_DOC = "a duration like 250ms, 5s, 10m, 1h30m, 2d, 1w, or an integer of milliseconds"


def _schedule_request() -> type[BaseModel]:
    """The body of ``POST /jobs``: the options of :class:`~jobwheel.producers.spec.JobSpec`
    (the one definition of the SDK, the CLI and this API) in their JSON forms."""
    from jobwheel.producers.spec import OPTIONS, json_name

    types: dict[str, Any] = {
        "text": StrictStr | None,
        "duration": Duration,
        "instant": StrictStr | None,
        "int": StrictInt,
        "json": Any,
        "flag": StrictBool,
    }
    fields: dict[str, Any] = {}
    for option in OPTIONS:
        meta = option.metadata
        help_ = meta["help"].replace("DURATION", _DURATION_DOC)
        if option.default is MISSING:  # required
            default, annotation = ..., StrictStr
        elif meta["form"] in {"duration", "instant"} or option.default is None:
            default, annotation = None, types[meta["form"]]  # None: the option's default
        else:
            default = getattr(option.default, "value", option.default)  # an enum: its name
            annotation = types[meta["form"]] if meta["form"] != "text" else StrictStr
        alias = json_name(option) if json_name(option) != option.name else None
        fields[option.name] = (annotation, Field(default, alias=alias, description=help_))
    return create_model(
        "ScheduleRequest",
        __config__=ConfigDict(extra="forbid", populate_by_name=True),
        __doc__="The options of ``JobClient.schedule``; exactly one of now/at/in/every/cron.",
        **fields,
    )


ScheduleRequest = _schedule_request()


def schedule_spec(req: BaseModel, max_args_bytes: int) -> Any:
    """The :class:`~jobwheel.producers.spec.JobSpec` of a ``POST /jobs`` body."""
    from jobwheel.producers.spec import spec_from_text

    return spec_from_text(req.model_dump(), max_args_bytes=max_args_bytes, args_as_text=False)


class ControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: StrictStr | None = Field(None, description="kept in the status event")


class Accepted(BaseModel):
    job_id: str
    command: str
    command_id: str | None = None
    run_id: str | None = Field(
        None, description="trigger: the id of the run it asks for (its answer is that run)"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="schedule: what is wrong with the job's task for the live workers (none "
        "serves it, some lack it, none is live); the job was sent anyway",
    )


class WorkerView(BaseModel):
    worker_id: str = Field(description="host:pid unless set")
    group: str
    tasks: list[str]
    host: str
    pid: int
    started_ms: int
    announced_ms: int = Field(description="its latest announcement")
    interval_ms: int = Field(description="how often it announces itself")
    inflight: int = Field(0, description="runs executing at its latest announcement")
    concurrency: int = Field(0, description="runs it may execute at once")
    finished_per_s: float = Field(0.0, description="runs finished per second, last interval")
    live: bool = Field(description="announced within its last 3 intervals")


class QueueView(BaseModel):
    queue: str
    group: str = Field(description="the pool's consumer group")
    topic: str = Field(description="the pool's runs topic")
    unfinished: int | None = Field(description="runs past the group's committed offsets")
    waiting: int | None = Field(description="unfinished runs no worker executes yet")
    inflight: int = Field(description="runs executing on the live workers")
    oldest_unfinished_age_s: float | None = Field(description="0 when none is unfinished")
    finished_per_s: float = Field(description="runs finished per second, last interval")
    workers: int = Field(description="live workers in the pool")
    concurrency: int = Field(description="runs the live workers may execute at once")
    read_at_ms: int
    error: str | None = Field(None, description="why Kafka's counts are missing")


class QueueList(BaseModel):
    queues: list[QueueView]


class WorkerList(BaseModel):
    topic: str
    read_at_ms: int
    workers: list[WorkerView]
    tasks: list[str] = Field(description="every task some live worker serves")


class JobView(BaseModel):
    job_id: str
    task: str | None
    queue: str = Field(description="the queue (worker pool) its latest definition names")
    state: str
    state_time_ms: int
    last_run_id: str | None
    attempts: int
    next_fire_ms: int | None
    last_error: str | None
    last_reason: str | None
    seq: int
    created_ms: int
    updated_ms: int


class RunView(BaseModel):
    job_id: str
    run_id: str
    task: str | None
    queue: str | None = Field(description="the queue it was sent to; null: dispatched by an "
                              "older scheduler, not known")  # fmt: skip
    state: str
    scheduled_time_ms: int | None
    dispatched_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    lateness_ms: int | None
    duration_ms: int | None
    attempts: int
    worker: str | None
    error: str | None
    reason: str | None
    deadline_ms: int | None
    last_heartbeat_ms: int | None
    updated_ms: int
    result_json: str | None = Field(
        None, description="a SUCCEEDED run's return value as JSON text (`error` otherwise)"
    )
    result: Any = Field(None, description="the same value, as JSON")


class EventView(BaseModel):
    event_time_ms: int
    state: str
    source: str
    run_id: str | None = None
    attempt: int
    seq: int
    worker: str | None = None
    reason: str | None = None
    error: str | None = None


class CommandVerdict(BaseModel):
    job_id: str
    command_id: str
    state: str = Field(
        description="the job's state after the command, or REJECTED (then `reason` says why: "
        "an unknown job, a job in a state the command does not apply to, an invalid command)"
    )
    reason: str | None
    event_time_ms: int


class JobDetail(BaseModel):
    job: JobView
    runs: list[RunView]
    events: list[EventView]


class RunDetail(BaseModel):
    run: RunView
    events: list[EventView]


class DeadLetterView(BaseModel):
    ref: str = Field(description="<partition>:<offset> on the dead-letter topic")
    partition: int
    offset: int
    timestamp_ms: int
    kind: str = Field(description=KINDS_DOC)
    job_id: str
    run_id: str | None
    task: str | None
    attempt: int | None
    error: str
    source: str | None = Field(description="topic:partition:offset of a bad record")
    what: str
    replayed: str | None = Field(
        None, description="how it is known to be replayed already (None: not known to be)"
    )


class DeadLetters(BaseModel):
    dead_letters: list[DeadLetterView]


class ReplayRequest(BaseModel):
    """Which dead letters to replay: every condition given must hold; or ``all``."""

    model_config = ConfigDict(extra="forbid")
    job: StrictStr | None = None
    task: StrictStr | None = None
    since: StrictStr | StrictInt | None = Field(None, description="an age (2h), ISO 8601, epoch ms")
    reason: StrictStr | None = Field(None, description="part of the error text")
    kind: StrictStr | None = Field(None, description=KINDS_DOC)
    refs: list[StrictStr] | None = Field(None, description="<partition>:<offset> of each")
    all: StrictBool = False
    dry_run: StrictBool = False
    note: StrictStr | None = Field(None, description="kept in a replayed run's DISPATCHED event")


class ReplayView(DeadLetterView):
    replayed: bool
    dry_run: bool
    command_id: str | None
    skipped: str | None


class Replays(BaseModel):
    replays: list[ReplayView]


class JobRuns(BaseModel):
    job_id: str
    runs: list[RunView]


class JobList(BaseModel):
    jobs: list[JobView]
    total: int
    limit: int
    offset: int


class StateCounts(BaseModel):
    states: dict[str, int]
    total: int


class SqlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sql: StrictStr = Field(description="one SELECT, WITH, SHOW, DESCRIBE or EXPLAIN statement")


class SqlResponse(BaseModel):
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool


class Health(BaseModel):
    status: str
    store: dict[str, Any]
    sink: dict[str, Any] | None
