"""The status API (FastAPI): accept job commands, answer job state, runs and read-only SQL.

Commands go to Kafka through :class:`producers.client.JobClient` (the API writes nothing to
ClickHouse itself); state comes from the status store, which the sink fills from the status
topic. So a job accepted here shows up in ``GET /jobs/{id}`` once the scheduler has emitted its
first status event and the sink has inserted it: eventually, normally within a second.

Errors: bad input is always a 4xx with a message that names what to fix. A jobwheel
``ValidationError`` becomes 422 ``{"detail": "field: message", "field", "message"}``; a refused
or failing SQL query 400 with ClickHouse's message; an unknown job 404; an unreachable broker or
store 503. OpenAPI docs are served at ``/docs``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from consumers.status import queries
from consumers.status.store import StatusStore
from jobwheel.errors import BrokerError, QueryError, StoreError, ValidationError

if TYPE_CHECKING:
    from consumers.status.sink import StatusSink
    from jobwheel.settings import Settings
    from producers.client import JobClient

log = logging.getLogger(__name__)


# --- request and response bodies ------------------------------------------------------------

Duration = str | int | None
_DURATION_DOC = "a duration like 250ms, 5s, 10m, 1h30m, 2d, or an integer of milliseconds"


class ScheduleRequest(BaseModel):
    """The arguments of ``JobClient.schedule``; give exactly one of now/at/in/every/cron."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    task: str = Field(description="registered task name, e.g. demo.echo")
    job_id: str | None = Field(None, description="default: a new uuid; same id replaces the job")
    args: Any = Field(None, description="task arguments (JSON; an object becomes kwargs)")
    now: bool = Field(False, description="run once, now")
    at: str | None = Field(None, description="run once at an ISO 8601 time with offset or Z")
    in_: Duration = Field(None, alias="in", description=f"run once after {_DURATION_DOC}")
    every: Duration = Field(None, description=f"run every {_DURATION_DOC}")
    start_at: str | None = Field(None, description="first fire of `every` (ISO 8601)")
    cron: str | None = Field(None, description="five-field cron expression")
    tz: str = Field("UTC", description="IANA time zone of `cron`")
    max_attempts: int = 3
    timeout: Duration = Field(None, description="per-attempt time limit")
    visibility_timeout: Duration = Field(None, description="redeliver after this (default 30s)")
    starting_deadline: Duration = Field(None, description="a fire later than this is MISSED")
    concurrency_policy: str = Field("ALLOW", description="ALLOW, FORBID or REPLACE")
    idempotency_key: str | None = None


class ControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(None, description="kept in the status event")


class Accepted(BaseModel):
    job_id: str
    command: str
    command_id: str | None = None


class JobView(BaseModel):
    job_id: str
    task: str | None
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


class JobDetail(BaseModel):
    job: JobView
    runs: list[RunView]
    events: list[EventView]


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
    sql: str = Field(description="one SELECT, WITH, SHOW, DESCRIBE or EXPLAIN statement")


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


def _duration(value: Duration, field: str) -> timedelta | None:
    from producers import validation as v

    if value is None:
        return None
    if isinstance(value, bool):
        raise ValidationError(field, f"must be {_DURATION_DOC}, got {value!r}")
    if isinstance(value, int):
        return timedelta(milliseconds=value)
    return v.parse_duration(value, field)


def schedule_kwargs(req: ScheduleRequest) -> dict[str, Any]:
    """``JobClient.schedule`` keyword arguments from the JSON body (text forms converted)."""
    from producers import validation as v
    from producers.client import DEFAULT_VISIBILITY_TIMEOUT

    return {
        "job_id": req.job_id,
        "task": req.task,
        "args": req.args,
        "now": req.now,
        "at": None if req.at is None else v.parse_instant(req.at, "at"),
        "in_": _duration(req.in_, "in"),
        "every": _duration(req.every, "every"),
        "start_at": None if req.start_at is None else v.parse_instant(req.start_at, "start_at"),
        "cron": req.cron,
        "tz": req.tz,
        "max_attempts": req.max_attempts,
        "timeout": _duration(req.timeout, "timeout"),
        "visibility_timeout": _duration(req.visibility_timeout, "visibility_timeout")
        or DEFAULT_VISIBILITY_TIMEOUT,
        "starting_deadline": _duration(req.starting_deadline, "starting_deadline"),
        "concurrency_policy": req.concurrency_policy,
        "idempotency_key": req.idempotency_key,
    }


class _Clients:
    """The JobClient, made on first use so the read endpoints work while Kafka is down."""

    def __init__(self, factory: Callable[[], JobClient]) -> None:
        self._factory = factory
        self._client: JobClient | None = None
        self._lock = threading.Lock()

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
        from producers.client import JobClient

        return JobClient(settings, delivery_timeout_s=15.0)

    clients = _Clients(job_client_factory or default_factory)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        thread = sink.start_thread() if sink is not None else None
        try:
            yield
        finally:
            if sink is not None and thread is not None:
                sink.stop()
                thread.join(timeout=30)
            clients.close()
            if close_store:
                store.close()

    app = FastAPI(
        title="jobwheel status API",
        version="1",
        description="Schedule and control jobs (commands go to Kafka) and read their state "
        "(from the ClickHouse status store). Times are epoch milliseconds UTC.",
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.sink = sink
    _install_error_handlers(app)

    # --- commands ------------------------------------------------------------------------

    @app.post("/jobs", status_code=202, response_model=Accepted, tags=["commands"])
    def schedule_job(req: ScheduleRequest) -> Accepted:
        """Schedule (or replace) a job. 202: the command is durable on the requests topic."""
        from producers.client import JobSpec, build_schedule

        # validated completely before a producer exists: a bad request sends nothing
        command = build_schedule(
            JobSpec(**schedule_kwargs(req)),
            now_ms=queries.now_ms(),
            max_args_bytes=settings.max_args_bytes,
        )
        clients.get().send(command)
        return Accepted(job_id=command.job_id, command="schedule", command_id=command.command_id)

    def control(kind: str) -> Callable[..., Accepted]:
        def handler(
            job_id: Annotated[str, Path(description="the job id")],
            body: Annotated[ControlRequest | None, Body()] = None,
        ) -> Accepted:
            from producers import validation as v

            reason = body.reason if body is not None else None
            v.job_id(job_id)
            v.optional_text(reason, "reason", v.MAX_REASON_CHARS)
            command_id = getattr(clients.get(), kind)(job_id, reason)
            return Accepted(job_id=job_id, command=kind, command_id=command_id)

        handler.__name__ = f"{kind}_job"
        handler.__doc__ = {
            "cancel": "Cancel: no further fires (an active run finishes).",
            "pause": "Pause the job's fires until resumed.",
            "resume": "Resume a paused job.",
            "trigger": "Run the job once now, outside its schedule.",
        }[kind]
        return handler

    for kind in ("cancel", "pause", "resume", "trigger"):
        app.post(
            f"/jobs/{{job_id:path}}/{kind}",
            status_code=202,
            response_model=Accepted,
            tags=["commands"],
        )(control(kind))

    # --- reads ---------------------------------------------------------------------------

    @app.get("/jobs/{job_id:path}/runs", response_model=JobRuns, tags=["status"])
    def get_job_runs(
        job_id: str, limit: Annotated[int, Query(ge=1, le=queries.MAX_LIST_LIMIT)] = 100
    ) -> dict[str, Any]:
        """The job's runs, newest first (404 if the store has never heard of the job)."""
        if queries.get_job(store, job_id) is None:
            return _not_found(job_id)  # type: ignore[return-value]
        return {"job_id": job_id, "runs": queries.job_runs(store, job_id, limit=limit)}

    @app.get("/jobs/{job_id:path}", response_model=JobDetail, tags=["status"])
    def get_job(job_id: str) -> dict[str, Any]:
        """Current state of a job, its runs, and its status events in lifecycle order."""
        job = queries.get_job(store, job_id)
        if job is None:
            return _not_found(job_id)  # type: ignore[return-value]
        return {
            "job": job,
            "runs": queries.job_runs(store, job_id),
            "events": queries.job_events(store, job_id),
        }

    @app.get("/jobs", response_model=JobList, tags=["status"])
    def list_jobs(
        state: Annotated[str | None, Query(description="current state, e.g. FAILED")] = None,
        task: Annotated[str | None, Query(description="task name")] = None,
        since: Annotated[
            str | None,
            Query(description="updated at or after: epoch ms, ISO 8601, or an age like 1h"),
        ] = None,
        until: Annotated[str | None, Query(description="updated at or before (same forms)")] = None,
        limit: Annotated[int, Query(ge=1, le=queries.MAX_LIST_LIMIT)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        """Jobs, most recently updated first, filtered and paged; ``total`` counts all matches."""
        now = queries.now_ms()
        flt = queries.JobFilter(
            state=queries.parse_state(state) if state else None,
            task=task or None,
            since_ms=queries.parse_time(since, "since", now=now) if since else None,
            until_ms=queries.parse_time(until, "until", now=now) if until else None,
            limit=limit,
            offset=offset,
        )
        page = queries.list_jobs(store, flt)
        return {"jobs": page.jobs, "total": page.total, "limit": page.limit, "offset": page.offset}

    @app.get("/stats/states", response_model=StateCounts, tags=["status"])
    def stats_states() -> StateCounts:
        """Jobs per current state."""
        counts = queries.state_counts(store)
        return StateCounts(states=counts, total=sum(counts.values()))

    @app.post("/sql", response_model=SqlResponse, tags=["status"])
    def sql(req: SqlRequest) -> dict[str, Any]:
        """Run one read-only statement (executed with readonly=1) against the status store.

        Tables: ``status_events`` (use FINAL), views ``jobs`` and ``runs``.
        """
        result = queries.run_read_only(store, req.sql)
        return jsonable_encoder(
            {
                "columns": result.columns,
                "types": result.types,
                "rows": result.rows,
                "truncated": result.truncated,
            }
        )

    @app.get("/health", response_model=Health, tags=["status"])
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

    return app


def _not_found(job_id: str) -> JSONResponse:
    return JSONResponse(
        {
            "detail": f"job {job_id!r} not found: the status store has no event for it (unknown "
            "id, or its first status event has not arrived yet)"
        },
        status_code=404,
    )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ValidationError)
    async def invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc), "field": exc.field, "message": exc.message}, status_code=422
        )

    @app.exception_handler(QueryError)
    async def bad_query(request: Request, exc: QueryError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(StoreError)
    async def store_down(request: Request, exc: StoreError) -> JSONResponse:
        log.error("status store error", extra={"path": request.url.path, "error": str(exc)})
        return JSONResponse({"detail": f"status store unavailable: {exc}"}, status_code=503)

    @app.exception_handler(BrokerError)
    async def broker_down(request: Request, exc: BrokerError) -> JSONResponse:
        log.error("broker error", extra={"path": request.url.path, "error": str(exc)})
        return JSONResponse(
            {"detail": f"command not accepted, Kafka did not confirm it: {exc}", "code": exc.code},
            status_code=503,
        )
