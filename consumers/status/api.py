"""The status API (FastAPI): accept job commands, answer job state, runs and read-only SQL.

Commands go to Kafka through :class:`jobwheel.producers.client.JobClient` (the API writes nothing to
ClickHouse itself); state comes from the status store, which the sink fills from the status
topic. So a job accepted here shows up in ``GET /jobs/{id}`` once the scheduler has emitted its
first status event and the sink has inserted it: eventually, normally within a second.

Errors: bad input is always a 4xx with a message that names what to fix. A jobwheel
``ValidationError``, and a body or query parameter of the wrong type, becomes 422
``{"detail": "field: message", "field", "message"}`` with long values cut; a refused or failing
SQL query 400 with ClickHouse's message; an unknown job 404; an unreachable broker or store 503.

Pages: ``/`` and ``/console/...`` are the web console (:mod:`jobwheel.consumers.status.console`);
``/docs`` is Swagger UI with its scripts and styles served from the installed
``fastapi-offline`` package (``/docs/static/...``), never from a CDN, so it works without
internet.

Authentication: with ``JOBWHEEL_API_TOKEN`` (and/or ``JOBWHEEL_API_READ_TOKEN``) set, every
API call needs ``Authorization: Bearer <token>``: 401 without it or with a wrong one, 403 when
the read token asks to write (:class:`BearerAuth`). The console's session cookie
(:mod:`jobwheel.consumers.status.console.session`) counts as the token it was issued for; a page
load without either is sent to the console's login form. Public are ``GET /health``, the login form
and the console's script and stylesheet, and the pages that describe the API: ``/docs`` (with
its assets) and ``/openapi.json``. They hold no data (the schema is what this source says), and
a user must be able to open the docs to enter the token: the docs page's *Authorize* button
takes it, and its *Try it out* calls send it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import MISSING
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, create_model

from jobwheel.consumers.status import console, queries
from jobwheel.consumers.status.console import session
from jobwheel.consumers.status.pools import PoolCollector, PoolReader
from jobwheel.consumers.status.sql import SqlRunner
from jobwheel.consumers.status.store import StatusStore
from jobwheel.errors import (
    BrokerError,
    QueryBusyError,
    QueryError,
    StoreError,
    ValidationError,
    clip,
)
from jobwheel.schemas import deadletter
from jobwheel.schemas.models import trigger_run_id

if TYPE_CHECKING:
    from jobwheel.consumers.status.sink import StatusSink
    from jobwheel.producers.client import JobClient
    from jobwheel.settings import Settings

log = logging.getLogger(__name__)


# --- request and response bodies ------------------------------------------------------------

# Strict: JSON true is not 1 ms, 1e20 is not an integer, "5" is not a number.
Duration = StrictStr | StrictInt | None
_KINDS = ", ".join(deadletter.KINDS)
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
    kind: str = Field(description=_KINDS)
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
    kind: StrictStr | None = Field(None, description=_KINDS)
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


# --- the app --------------------------------------------------------------------------------


def schedule_spec(req: BaseModel, max_args_bytes: int) -> Any:
    """The :class:`~jobwheel.producers.spec.JobSpec` of a ``POST /jobs`` body."""
    from jobwheel.producers.spec import spec_from_text

    return spec_from_text(req.model_dump(), max_args_bytes=max_args_bytes, args_as_text=False)


class _Clients:
    """The JobClient, made on first use so the read endpoints work while Kafka is down."""

    def __init__(self, factory: Callable[[], JobClient], settings: Settings) -> None:
        from jobwheel.kafka.queues import QueueDirectory, admin_topic_lister

        self._factory = factory
        self._client: JobClient | None = None
        self._lock = threading.Lock()
        #: JOBWHEEL_QUEUES and the queues added at run time: a job naming neither is refused
        #: (422) before a producer exists; when the broker cannot be asked, the scheduler
        #: decides.
        lister = admin_topic_lister(settings, "jobwheel.consumers.status")
        self.queues = QueueDirectory(settings, lister, benefit_of_doubt=True)

    def get(self) -> JobClient:
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def create_app(
    settings: Settings,
    store: StatusStore,
    *,
    sink: StatusSink | None = None,
    job_client_factory: Callable[[], JobClient] | None = None,
    close_store: bool = False,
) -> FastAPI:
    """The API over one shared store; with ``sink``, the sink runs in a thread for the app's
    lifetime (embedded mode: this process is the only one that can open the chdb directory).
    ``close_store`` closes the store at shutdown, after the sink stopped (``jobwheel serve``:
    uvicorn re-raises SIGTERM after its graceful shutdown, so code after ``run`` never runs)."""

    def default_factory() -> JobClient:
        from jobwheel.producers.client import JobClient

        return JobClient(settings, delivery_timeout_s=15.0)

    clients = _Clients(job_client_factory or default_factory, settings)
    sql_runner = SqlRunner.for_store(settings, store)
    tokens = settings.api_tokens()
    pools = PoolReader(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        thread = sink.start_thread() if sink is not None else None
        uninstall = PoolCollector(pools).install()  # the pools' jobwheel_queue_* metrics
        try:
            yield
        finally:
            uninstall()
            if sink is not None and thread is not None:
                sink.stop()
                thread.join(timeout=30)
            clients.close()
            sql_runner.close()
            if close_store:
                store.close()

    app: FastAPI = FastAPIOffline(
        title="jobwheel status API",
        version="1",
        description="Schedule and control jobs (commands go to Kafka) and read their state "
        "(from the ClickHouse status store). Times are epoch milliseconds UTC."
        + (" Every call needs the API token: enter it with *Authorize*." if tokens.enabled else ""),
        lifespan=lifespan,
        redoc_url=None,
        static_url=DOCS_STATIC,
    )
    if tokens.enabled:
        _declare_bearer(app)
    app.state.store = store
    app.state.sink = sink
    app.state.pools = pools  # the console's cluster page reads the same signals
    app.state.sql_runner = sql_runner
    _install_error_handlers(app)
    if tokens.enabled:
        app.add_middleware(BearerAuth, write=tokens.write, read=tokens.read)
    console.install(app, settings, store)

    app.include_router(jobs_router(settings, store, clients))
    app.include_router(runs_router(store))
    app.include_router(dead_letters_router(settings, store, clients))
    app.include_router(sql_router(sql_runner))
    app.include_router(ops_router(settings, store, sink, pools))
    return app


def jobs_router(settings: Settings, store: StatusStore, clients: _Clients) -> APIRouter:
    """Jobs: schedule one, control it, read its answers, runs and state, list and count them.

    The order is the order of matching: ``/jobs/{id}/runs`` and ``/jobs/{id}/commands/...``
    come before ``/jobs/{job_id:path}``, which would take them as a job id."""
    router = APIRouter()
    _job_commands(router, settings, clients)
    _job_reads(router, store)
    _job_lists(router, store)
    return router


def _job_commands(router: APIRouter, settings: Settings, clients: _Clients) -> None:
    """``POST /jobs`` and its cancel, pause, resume and trigger: commands sent to Kafka."""

    @router.post("/jobs", status_code=202, response_model=Accepted, tags=["commands"])
    def schedule_job(
        req: ScheduleRequest,
        require_worker: Annotated[
            bool,
            Query(
                description="refuse (422, nothing sent) when no live worker serves the task, "
                "instead of answering with a warning"
            ),
        ] = False,
    ) -> Accepted:
        """Schedule (or replace) a job. 202: the command is durable on the requests topic.
        A task that not every live worker serves (by their announcements on the workers
        topic) is named in ``warnings``; with ``require_worker=true`` it is refused."""
        from jobwheel.producers.spec import build_schedule

        # validated completely before a producer exists: a bad request sends nothing
        command = build_schedule(
            schedule_spec(req, settings.max_args_bytes),
            now_ms=queries.now_ms(),
            max_args_bytes=settings.max_args_bytes,
            queues=clients.queues,
        )
        problems = clients.get().send_checked(command, require_worker=require_worker)
        return Accepted(
            job_id=command.job_id,
            command="schedule",
            command_id=command.command_id,
            warnings=problems,
        )

    def control(kind: str) -> Callable[..., Accepted]:
        def handler(
            job_id: Annotated[str, Path(description="the job id")],
            body: Annotated[ControlRequest | None, Body()] = None,
        ) -> Accepted:
            from jobwheel.schemas import validation as rules

            reason = body.reason if body is not None else None
            rules.job_id(job_id)
            rules.optional_text(reason, "reason", rules.MAX_REASON_CHARS)
            command = clients.get().control(kind, job_id, reason)
            run_id = trigger_run_id(job_id, command.issued_at_ms) if kind == "trigger" else None
            return Accepted(
                job_id=job_id, command=kind, command_id=command.command_id, run_id=run_id
            )

        handler.__name__ = f"{kind}_job"
        handler.__doc__ = {
            "cancel": "Cancel: no further fires (an active run finishes).",
            "pause": "Pause the job's fires until resumed.",
            "resume": "Resume a paused job.",
            "trigger": "Run the job once now, outside its schedule.",
        }[kind]
        return handler

    for kind in ("cancel", "pause", "resume", "trigger"):
        router.post(
            f"/jobs/{{job_id:path}}/{kind}",
            status_code=202,
            response_model=Accepted,
            tags=["commands"],
        )(control(kind))


def _job_reads(router: APIRouter, store: StatusStore) -> None:
    """One job from the status store: a command's answer, its runs, its state and events."""

    @router.get(
        "/jobs/{job_id:path}/commands/{command_id}", response_model=CommandVerdict, tags=["status"]
    )
    def get_command_verdict(job_id: str, command_id: str) -> Any:
        """The scheduler's answer to a command (the ``command_id`` of a 202 from
        ``POST /jobs``, ``/cancel``, ``/pause``, ``/resume``): the job's new state, or
        REJECTED and why (e.g. an unknown job: no job is created for it). 404 until the answer
        is in the store, normally within a second. A trigger's answer is its run
        (``GET /jobs/{id}/runs``), or a REJECTED here."""
        verdict = queries.command_verdict(store, job_id, command_id)
        if verdict is None:
            return JSONResponse(
                {
                    "detail": f"no answer from the scheduler for command {clip(command_id)} of "
                    f"job {clip(job_id)} yet (or not a command of this job)"
                },
                status_code=404,
            )
        return {"job_id": job_id, "command_id": command_id, **verdict}

    @router.get("/jobs/{job_id:path}/runs", response_model=JobRuns, tags=["status"])
    def get_job_runs(
        job_id: str, limit: Annotated[int, Query(ge=1, le=queries.MAX_LIST_LIMIT)] = 100
    ) -> dict[str, Any]:
        """The job's runs, newest first (404 if the store has never heard of the job). The id
        may be a unique prefix (4 characters or more), as for ``GET /jobs/{id}``."""
        job = queries.find_job(store, job_id)
        if job is None:
            return _not_found(job_id)  # type: ignore[return-value]
        job_id = job["job_id"]
        return {"job_id": job_id, "runs": queries.job_runs(store, job_id, limit=limit)}

    @router.get("/jobs/{job_id:path}", response_model=JobDetail, tags=["status"])
    def get_job(job_id: str) -> dict[str, Any]:
        """Current state of a job, its runs, and its status events in lifecycle order. The id
        may be a unique prefix of one (4 characters or more; the answer names the whole id); a
        prefix of several is refused (422) naming some of them."""
        job = queries.find_job(store, job_id)
        if job is None:
            return _not_found(job_id)  # type: ignore[return-value]
        job_id = job["job_id"]
        return {
            "job": job,
            "runs": queries.job_runs(store, job_id),
            "events": queries.job_events(store, job_id),
        }


def _job_lists(router: APIRouter, store: StatusStore) -> None:
    """Jobs listed and counted by state."""

    @router.get("/jobs", response_model=JobList, tags=["status"])
    def list_jobs(
        state: Annotated[
            str | None,
            Query(description="the job's state: SCHEDULED, PAUSED, COMPLETED, DEAD or CANCELLED"),
        ] = None,
        task: Annotated[str | None, Query(description="task name")] = None,
        queue: Annotated[str | None, Query(description="queue (worker pool)")] = None,
        since: Annotated[
            str | None,
            Query(description="updated at or after: epoch ms, ISO 8601, or an age like 1h"),
        ] = None,
        until: Annotated[str | None, Query(description="updated at or before (same forms)")] = None,
        limit: Annotated[int, Query(ge=1, le=queries.MAX_LIST_LIMIT)] = 100,
        offset: Annotated[int, Query(ge=0, le=queries.MAX_LIST_OFFSET)] = 0,
    ) -> dict[str, Any]:
        """Jobs, most recently updated first, filtered and paged; ``total`` counts all matches."""
        now = queries.now_ms()
        flt = queries.JobFilter(
            state=queries.parse_state(state) if state else None,
            task=task or None,
            queue=queue or None,
            since_ms=queries.parse_time(since, "since", now=now) if since else None,
            until_ms=queries.parse_time(until, "until", now=now) if until else None,
            limit=limit,
            offset=offset,
        )
        page = queries.list_jobs(store, flt)
        return {"jobs": page.jobs, "total": page.total, "limit": page.limit, "offset": page.offset}

    @router.get("/stats/states", response_model=StateCounts, tags=["status"])
    def stats_states() -> StateCounts:
        """Jobs per state (SCHEDULED, PAUSED, COMPLETED, DEAD, CANCELLED; only those that
        occur)."""
        counts = queries.state_counts(store)
        return StateCounts(states=counts, total=sum(counts.values()))


def runs_router(store: StatusStore) -> APIRouter:
    """Runs: one run and its status events."""
    router = APIRouter()

    @router.get("/runs/{run_id:path}", response_model=RunDetail, tags=["status"])
    def get_run(run_id: str) -> Any:
        """One run: its state, timing, worker, result (a SUCCEEDED run's return value) or
        error, and its status events."""
        run = queries.get_run(store, run_id)
        if run is None:
            return JSONResponse(
                {"detail": f"unknown run {clip(run_id)}: not in the status store (yet)"},
                status_code=404,
            )
        return {"run": run, "events": queries.run_events(store, run_id)}

    return router


def dead_letters_router(settings: Settings, store: StatusStore, clients: _Clients) -> APIRouter:
    """Dead letters: read them from the dead-letter topic and replay them."""
    router = APIRouter()

    @router.get("/dead-letters", response_model=DeadLetters, tags=["dead letters"])
    def list_dead_letters(
        since: Annotated[str | None, Query(description="an age (2h), ISO 8601, epoch ms")] = None,
        task: str | None = None,
        reason: Annotated[str | None, Query(description="part of the error text")] = None,
        job: str | None = None,
        kind: Annotated[str | None, Query(description=_KINDS)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        """Dead letters, oldest first (read from the dead-letter topic in Kafka)."""
        from jobwheel.producers.deadletters import read_dead_letters, replay_marks

        flt = _dead_letter_filter(since, task, reason, job, kind, limit)
        letters = read_dead_letters(settings, flt, timeout_s=20.0)
        marks = replay_marks(letters, lambda d: queries.replayed_already(store, d))
        return {"dead_letters": [{**d.as_dict(), "replayed": marks.get(d.ref)} for d in letters]}

    @router.post("/dead-letters/replay", response_model=Replays, tags=["dead letters"])
    def replay_dead_letters(req: ReplayRequest) -> dict[str, Any]:
        """Put dead runs and rejected commands back after a fix (what `jobwheel dlq replay`
        does: a dead run is dispatched again as the same run, a rejected command is produced
        again only if the scheduler would accept it now; runs no longer DEAD and commands
        applied since are skipped). ``dry_run`` says what would be sent."""
        from jobwheel.producers.deadletters import read_dead_letters, replay

        chosen = any(
            v is not None for v in (req.job, req.task, req.since, req.reason, req.kind, req.refs)
        )
        if req.all == chosen:
            raise ValidationError(
                "all", "choose job, task, since, reason, kind or refs, or set all (not both)"
            )
        flt = _dead_letter_filter(req.since, req.task, req.reason, req.job, req.kind, 10_000)
        letters = read_dead_letters(settings, flt, timeout_s=20.0)
        if req.refs is not None:
            letters = [d for d in letters if d.ref in set(req.refs)]
        outcomes = replay(
            settings,
            letters,
            client=clients.get(),
            dry_run=req.dry_run,
            reason=req.note,
            already=lambda d: queries.replayed_already(store, d),
        )
        return {"replays": [o.as_dict() for o in outcomes]}

    return router


def sql_router(sql_runner: SqlRunner) -> APIRouter:
    """Read-only SQL against the status store."""
    router = APIRouter()

    @router.post("/sql", response_model=SqlResponse, tags=["status"])
    def sql(req: SqlRequest) -> dict[str, Any]:
        """Run one read-only statement against the status store (no INTO OUTFILE, no table
        functions that reach files or the network, no SETTINGS; 30 s and 10,000 rows at most).

        Tables: ``status_events`` (use FINAL), views ``jobs`` and ``runs``.
        """
        result = sql_runner.run(req.sql)
        return jsonable_encoder(
            {
                "columns": result.columns,
                "types": result.types,
                "rows": result.rows,
                "truncated": result.truncated,
            }
        )

    return router


def ops_router(
    settings: Settings, store: StatusStore, sink: StatusSink | None, pools: PoolReader
) -> APIRouter:
    """Operations: the workers' announcements, the pools' signals and the API's health."""
    router = APIRouter()

    @router.get("/queues", response_model=QueueList, tags=["status"])
    def list_queues() -> Any:
        """Each declared queue's worker pool, to scale it on (consumers/status/pools.py):
        runs not finished (the group's lag), running, waiting for a slot, the oldest one's
        age, runs finished per second and the live workers. Read from Kafka at most every
        few seconds; a pool Kafka did not answer for has null counts and an ``error``."""
        return {"queues": [p.as_dict() for p in pools.pools()]}

    @router.get("/workers", response_model=WorkerList, tags=["status"])
    def list_workers() -> Any:
        """The workers as they announce themselves on the workers topic (its latest record
        per worker: a worker that exited cleanly is gone, one killed stays, not live, until
        the topic's retention drops it), and the tasks the live ones serve."""
        from jobwheel.producers.workers import read_workers

        found = read_workers(settings)
        if found is None:
            raise BrokerError(
                f"the topic {settings.topics.workers} does not exist: run `jobwheel topics "
                "ensure` (workers announce themselves there from this version on)",
                code="UNKNOWN_TOPIC_OR_PART",
            )
        live = found.live
        return {
            "topic": found.topic,
            "read_at_ms": found.read_at_ms,
            "workers": [
                {**w.as_dict(), "live": w.is_live(found.read_at_ms)} for w in found.workers
            ],
            "tasks": sorted({t for w in live for t in w.tasks}),
        }

    @router.get("/health", response_model=Health, tags=["status"])
    def health() -> JSONResponse:
        """200 when the store answers (and the in-process sink, if any, is running)."""
        store_ok = store.ping()
        sink_stats = sink.stats.as_dict() if sink is not None else None
        ok = store_ok and (sink is None or sink.stats.running)
        body = Health(
            status="ok" if ok else "degraded",
            store={"ok": store_ok, "embedded": store.embedded, "database": store.database},
            sink=sink_stats,
        )
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    return router


def _dead_letter_filter(
    since: str | int | None,
    task: str | None,
    reason: str | None,
    job: str | None,
    kind: str | None,
    limit: int,
) -> Any:
    from jobwheel.producers.deadletters import Filter

    return Filter(
        since_ms=queries.parse_time(since, "since") if since is not None else None,
        task=task or None,
        reason=reason or None,
        job_id=job or None,
        kind=kind or None,
        limit=limit,
    )


def _not_found(job_id: str) -> JSONResponse:
    short = len(job_id) < queries.MIN_JOB_ID_PREFIX
    return JSONResponse(
        {
            "detail": f"unknown job {clip(job_id)}: not found in the status store (never "
            "scheduled, or its first status event has not arrived yet)"
            + (
                f"; the start of an id names a job from {queries.MIN_JOB_ID_PREFIX} characters on"
                if short
                else ""
            )
        },
        status_code=404,
    )


def _request_error(exc: RequestValidationError) -> ValidationError:
    """FastAPI's list of type errors as one jobwheel error naming the first field (its input
    cut: FastAPI's own answer echoes the whole value, 10,000 characters of a task name)."""
    errors = exc.errors()
    if not errors:
        return ValidationError("request", "is invalid")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())]
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    field = loc[0] if loc else "body"
    field = field if field.strip() else repr(field)  # a blank key is named, never ""
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        name = field if len(field) <= 60 else field[:60] + "…"
        return ValidationError(name, "is not a known field")
    if kind == "missing":
        return ValidationError(field, "is required")
    if kind == "json_invalid":
        return ValidationError("body", f"is not valid JSON: {first.get('msg', '')}")
    got = f", got {clip(first['input'])}" if "input" in first else ""
    # A union (a duration is text or whole milliseconds) reports one error per member type.
    members = [
        str(e["loc"][2]) for e in errors if len(e.get("loc", ())) > 2 and str(e["loc"][1]) == field
    ]
    if len(members) > 1:
        kinds = {"str": "a string", "int": "an integer", "bool": "true/false"}
        expected = " or ".join(kinds.get(m, m) for m in members)
        return ValidationError(field, f"must be {expected}{got}")
    return ValidationError(field, f"{first.get('msg', 'is invalid')}{got}")


DOCS_STATIC = "/docs/static"


def _declare_bearer(app: FastAPI) -> None:
    """The OpenAPI document says every operation takes the bearer token, so the docs page
    offers *Authorize* and sends the token with *Try it out*."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                "type": "http",
                "scheme": "bearer",
                "description": "JOBWHEEL_API_TOKEN (all calls) or JOBWHEEL_API_READ_TOKEN "
                "(reads only)",
            }
            schema["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class BearerAuth:
    """Bearer-token check in front of every API call (a plain ASGI middleware); ``/health``
    and the pages describing the API are public (see the module doc).

    Tokens are compared as SHA-256 digests with :func:`hmac.compare_digest`: equal lengths and
    constant time, so neither the token's length nor its prefix leaks through response times.
    """

    PUBLIC = frozenset(
        {
            "/health",
            "/docs",
            "/docs/oauth2-redirect",
            "/openapi.json",
            "/console/login",
            "/console/logout",
        }
    )
    PUBLIC_PREFIXES = (DOCS_STATIC + "/", "/console/static/")
    #: What the read token may do besides GET: ``/sql`` reads (it is refused any write).
    READ_POSTS = frozenset({"/sql"})

    def __init__(self, app: Any, *, write: str | None, read: str | None) -> None:
        self.app = app
        self._write = _digest(write) if write else None
        self._read = _digest(read) if read else None
        self._tokens = (write, read)  # the console's session cookies are signed with them

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or path in self.PUBLIC
            or (path.startswith(self.PUBLIC_PREFIXES) and ".." not in path)
        ):
            await self.app(scope, receive, send)
            return
        grant = self._grant(_bearer(scope))
        if grant is None:
            # The console's cookie: page loads (GET) as they are; a change only with the
            # console's header, which another site's page cannot send (see session's doc).
            write, read = self._tokens
            cookie = session.verify(session.cookie_from(scope), write=write, read=read)
            if cookie is not None and (
                scope["method"] in ("GET", "HEAD") or session.has_csrf_header(scope)
            ):
                grant = cookie
        if grant is None and scope["method"] in ("GET", "HEAD") and _is_page(path):
            await _redirect(send, scope, console.login_redirect(path, _query(scope)))
            return
        if grant is None:
            await _deny(
                send,
                401,
                "missing or wrong API token: send `Authorization: Bearer <token>` "
                "(jobwheel reads it from JOBWHEEL_API_TOKEN or JOBWHEEL_API_TOKEN_FILE)",
            )
            return
        reads = scope["method"] in ("GET", "HEAD") or scope["path"] in self.READ_POSTS
        if grant == "read" and not reads:
            await _deny(send, 403, "the read token cannot schedule or control jobs")
            return
        scope["jobwheel.grant"] = grant
        await self.app(scope, receive, send)

    def _grant(self, presented: bytes | None) -> str | None:
        given = _digest(presented or b"")
        # both compared every time: which token matched does not show in the timing either
        write = self._write is not None and hmac.compare_digest(given, self._write)
        read = self._read is not None and hmac.compare_digest(given, self._read)
        if presented and write:
            return "write"
        if presented and read:
            return "read"
        return None


def _is_page(path: str) -> bool:
    return path == "/" or path == "/console" or path.startswith("/console/")


def _query(scope: Any) -> str:
    return bytes(scope.get("query_string", b"")).decode("latin-1")


async def _redirect(send: Any, scope: Any, location: str) -> None:
    target = (scope.get("root_path", "") + location).encode("latin-1", "replace")
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [(b"location", target), (b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def _digest(token: str | bytes) -> bytes:
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


def _bearer(scope: Any) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return bytes(token.strip())
            return None
    return None


async def _deny(send: Any, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="jobwheel"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        error = _request_error(exc)
        return JSONResponse(
            {"detail": str(error), "field": error.field, "message": error.message},
            status_code=422,
        )

    @app.exception_handler(ValidationError)
    async def invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc), "field": exc.field, "message": exc.message}, status_code=422
        )

    @app.exception_handler(QueryError)
    async def bad_query(request: Request, exc: QueryError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(QueryBusyError)
    async def busy(request: Request, exc: QueryBusyError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=429, headers={"Retry-After": "1"})

    @app.exception_handler(StoreError)
    async def store_down(request: Request, exc: StoreError) -> JSONResponse:
        log.error("status store error", extra={"path": request.url.path, "error": str(exc)})
        return JSONResponse({"detail": f"status store unavailable: {exc}"}, status_code=503)

    @app.exception_handler(BrokerError)
    async def broker_down(request: Request, exc: BrokerError) -> JSONResponse:
        log.error("broker error", extra={"path": request.url.path, "error": str(exc)})
        return JSONResponse(
            {
                "detail": f"Kafka could not be read: {exc}"
                if request.method == "GET"  # GET /workers, /dead-letters read topics
                else f"command not accepted, Kafka did not confirm it: {exc}",
                "code": exc.code,
            },
            status_code=503,
        )
