"""The status API (FastAPI): accept job commands, answer job state, runs and read-only SQL.

Commands go to Kafka through :class:`jobwheel.producers.client.JobClient` (the API writes nothing to
ClickHouse itself); state comes from the status store, which the sink fills from the status
topic. So a job accepted here shows up in ``GET /jobs/{id}`` once the scheduler has emitted its
first status event and the sink has inserted it: eventually, normally within a second.

Routes: one router per resource in :mod:`jobwheel.consumers.status.routes` (jobs, runs, dead
letters, SQL, pools and workers, health), their bodies in its ``models``; this module builds
what they share, includes them and adds the error handlers and the token check.

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
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from jobwheel.consumers.status import console
from jobwheel.consumers.status.console import session
from jobwheel.consumers.status.pools import PoolCollector, PoolReader
from jobwheel.consumers.status.routes.deadletters import dead_letters_router
from jobwheel.consumers.status.routes.health import health_router
from jobwheel.consumers.status.routes.jobs import jobs_router
from jobwheel.consumers.status.routes.models import (
    Accepted,
    CommandVerdict,
    ControlRequest,
    DeadLetters,
    DeadLetterView,
    EventView,
    Health,
    JobDetail,
    JobList,
    JobRuns,
    JobView,
    QueueList,
    QueueView,
    ReplayRequest,
    Replays,
    ReplayView,
    RunDetail,
    RunView,
    ScheduleRequest,
    SqlRequest,
    SqlResponse,
    StateCounts,
    WorkerList,
    WorkerView,
    schedule_spec,
)
from jobwheel.consumers.status.routes.pools import pools_router
from jobwheel.consumers.status.routes.runs import runs_router
from jobwheel.consumers.status.routes.sql import sql_router
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

if TYPE_CHECKING:
    from jobwheel.consumers.status.sink import StatusSink
    from jobwheel.producers.client import JobClient
    from jobwheel.settings import Settings

#: The request and response bodies live in routes.models; importable from here as before.
__all__ = [
    "Accepted",
    "BearerAuth",
    "CommandVerdict",
    "ControlRequest",
    "DeadLetterView",
    "DeadLetters",
    "EventView",
    "Health",
    "JobDetail",
    "JobList",
    "JobRuns",
    "JobView",
    "QueueList",
    "QueueView",
    "ReplayRequest",
    "ReplayView",
    "Replays",
    "RunDetail",
    "RunView",
    "ScheduleRequest",
    "SqlRequest",
    "SqlResponse",
    "StateCounts",
    "WorkerList",
    "WorkerView",
    "create_app",
    "schedule_spec",
]

log = logging.getLogger(__name__)


# --- the app --------------------------------------------------------------------------------


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
    app.include_router(pools_router(settings, pools))
    app.include_router(health_router(store, sink))
    return app


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
