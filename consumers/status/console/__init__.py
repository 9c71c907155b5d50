"""The web console: server-rendered pages over the status API's own data, at ``/``.

Pages: ``/`` (jobs by state, run events per minute and lateness percentiles as charts, the
pipeline's groups), ``/console/jobs`` (jobs by state, task and age), ``/console/jobs/{id}``
(definition, runs with lateness, duration and result or error, events, and the pause, resume,
trigger and cancel buttons), ``/console/cluster`` (schedulers and workers with their
partitions, each partition's last commit), ``/console/dead-letters`` (with replay buttons).

No build step and nothing from the internet: HTML from :mod:`.pages`, charts as inline SVG
(:mod:`.charts`), one small stylesheet and one small script in ``static/``. The script does
only what needs the page to stay put: a button sends the same API call the CLI sends
(``POST /jobs/{id}/pause`` ...), waits for the scheduler's answer
(``GET /jobs/{id}/commands/{command id}``), says it and reloads.

Authentication when the API has tokens: :mod:`.session` (a login form, then a signed cookie);
the API's middleware accepts that cookie as it accepts the bearer header.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.console import pages, session
from jobwheel.errors import JobwheelError, ValidationError

if TYPE_CHECKING:
    from jobwheel.consumers.status.store import StatusStore
    from jobwheel.settings import ApiTokens, Settings

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
STATIC_FILES = {"console.css": "text/css", "console.js": "text/javascript"}
HTML_HEADERS = {
    "cache-control": "no-store",
    # nothing but this origin's own script, style and images; no frames (clickjacking)
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
}
#: How a page learns its root path, the user's grant and the time (made per request).
PageFor = Callable[[Request], pages.Page]


def install(app: FastAPI, settings: Settings, store: StatusStore) -> None:
    """Add the console's routes to the API ``app``."""
    app.include_router(console_router(settings, store))


def console_router(settings: Settings, store: StatusStore) -> APIRouter:
    """The console's pages, registered one page (or one form) at a time."""
    tokens = settings.api_tokens()

    def page_for(request: Request) -> pages.Page:
        return pages.Page(
            request.scope.get("root_path", ""),
            auth=tokens.enabled,
            grant=request.scope.get("jobwheel.grant"),
            now_ms=queries.now_ms(),
        )

    router = APIRouter()
    _overview_page(router, settings, store, page_for)
    _job_pages(router, store, page_for)
    _cluster_page(router, settings, store, page_for)
    _dead_letters_page(router, settings, page_for)
    _login_pages(router, tokens, page_for)
    _static_files(router)
    return router


def html(text: str, status_code: int = 200) -> HTMLResponse:
    """A page with the console's headers (no caching, this origin's scripts only)."""
    return HTMLResponse(text, status_code=status_code, headers=HTML_HEADERS)


def _overview_page(
    router: APIRouter, settings: Settings, store: StatusStore, page_for: PageFor
) -> None:
    """``/``: jobs by state, runs and lateness over a range, the pipeline's groups; ``/console``
    leads there."""

    @router.get("/", include_in_schema=False)
    def overview(request: Request, range: str = "1h") -> HTMLResponse:
        page = page_for(request)
        key = range if range in pages.RANGES else "1h"
        end = page.now_ms
        start = end - pages.RANGES[key]
        from jobwheel.consumers.status import cluster

        return html(
            pages.overview(
                page,
                counts=queries.state_counts(store),
                range_key=key,
                start_ms=start,
                end_ms=end,
                runs_per_minute=queries.panel(store, "runs_per_minute", start, end),
                lateness=queries.panel(store, "lateness", start, end),
                schedulers=cluster.describe_group(
                    settings, settings.scheduler_app_id, settings.topics.requests, 3.0
                ),
                workers=cluster.describe_group(
                    settings, settings.worker_group, settings.topics.runs, 3.0
                ),
            )
        )

    @router.get("/console", include_in_schema=False)
    @router.get("/console/", include_in_schema=False)
    def console_root(request: Request) -> RedirectResponse:
        return RedirectResponse(page_for(request).url("/"), status_code=303)


def _job_pages(router: APIRouter, store: StatusStore, page_for: PageFor) -> None:
    """``/console/jobs`` and one job's page."""

    @router.get("/console/jobs", include_in_schema=False)
    def jobs(
        request: Request,
        state: str | None = None,
        task: str | None = None,
        queue: str | None = None,
        since: str | None = None,
        offset: int = 0,
    ) -> HTMLResponse:
        page = page_for(request)
        limit = 50
        error = None
        try:
            flt = queries.JobFilter(
                state=queries.parse_state(state) if state else None,
                task=task or None,
                queue=queue or None,
                since_ms=queries.parse_time(since, "since", now=page.now_ms) if since else None,
                limit=limit,
                offset=max(0, offset),
            )
            found = queries.list_jobs(store, flt)
            rows, total = found.jobs, found.total
        except ValidationError as exc:
            rows, total, error = [], 0, str(exc)
        return html(
            pages.jobs(
                page,
                jobs=rows,
                total=total,
                counts=queries.state_counts(store),
                state=state.upper() if state else None,
                task=task,
                queue=queue,
                since=since,
                limit=limit,
                offset=max(0, offset),
                error=error,
            )
        )

    @router.get("/console/jobs/{job_id:path}", include_in_schema=False)
    def job(request: Request, job_id: str) -> HTMLResponse:
        page = page_for(request)
        found = queries.get_job(store, job_id)
        if found is None:
            return html(
                pages.not_found(
                    page,
                    f"No job {job_id!r} in the status store (never scheduled, or its first event "
                    "has not arrived yet).",
                ),
                404,
            )
        spec = queries.job_spec(store, job_id)
        return html(
            pages.job(
                page,
                job=found,
                runs=queries.job_runs(store, job_id),
                events=queries.job_events(store, job_id),
                spec=spec,
                next_fires=queries.next_fires(found, spec, 5),
            )
        )


def _cluster_page(
    router: APIRouter, settings: Settings, store: StatusStore, page_for: PageFor
) -> None:
    """``/console/cluster``: schedulers and workers, their partitions and announcements."""

    @router.get("/console/cluster", include_in_schema=False)
    def cluster_page(request: Request) -> HTMLResponse:
        from jobwheel.consumers.status import cluster
        from jobwheel.producers.workers import read_workers

        page = page_for(request)
        progress, problem = cluster.scheduler_progress(settings, 5.0)
        roster, roster_error = None, None
        try:
            roster = read_workers(settings)
            if roster is None:
                roster_error = (
                    f"the topic {settings.topics.workers} does not exist: run `jobwheel "
                    "topics ensure`"
                )
        except JobwheelError as exc:
            roster_error = f"cannot read {settings.topics.workers}: {exc}"
        return html(
            pages.cluster(
                page,
                schedulers=cluster.describe_group(
                    settings, settings.scheduler_app_id, settings.topics.requests
                ),
                progress=progress,
                progress_error=problem,
                workers=cluster.describe_group(
                    settings, settings.worker_group, settings.topics.runs
                ),
                activity=queries.worker_activity(store, page.now_ms - 3_600_000),
                roster=roster,
                roster_error=roster_error,
                pools=_pools(request, settings),
            )
        )


def _pools(request: Request, settings: Settings) -> list[Any]:
    """The pools' signals: the app's reader (shared with GET /queues and the metrics), or a
    read of its own where the console runs in an app without one."""
    from jobwheel.consumers.status.pools import read_pools

    reader = getattr(request.app.state, "pools", None)
    return reader.pools() if reader is not None else read_pools(settings, 5.0)


def _dead_letters_page(router: APIRouter, settings: Settings, page_for: PageFor) -> None:
    """``/console/dead-letters``, read from Kafka."""

    @router.get("/console/dead-letters", include_in_schema=False)
    def dead_letters(
        request: Request,
        since: str = "7d",
        kind: str | None = None,
        task: str | None = None,
        reason: str | None = None,
    ) -> HTMLResponse:
        from jobwheel.producers.deadletters import Filter, read_dead_letters

        page = page_for(request)
        letters: list[dict[str, Any]] = []
        error = None
        try:
            flt = Filter(
                since_ms=queries.parse_time(since, "since", now=page.now_ms) if since else None,
                kind=kind or None,
                task=task or None,
                reason=reason or None,
                limit=500,
            )
            letters = [d.as_dict() for d in read_dead_letters(settings, flt, timeout_s=15.0)]
        except JobwheelError as exc:
            error = str(exc)
        return html(
            pages.dead_letters(
                page,
                letters=letters,
                since=since,
                kind=kind or None,
                task=task,
                reason=reason,
                error=error,
            )
        )


def _login_pages(router: APIRouter, tokens: ApiTokens, page_for: PageFor) -> None:
    """The login form, login and logout (:mod:`.session`)."""

    @router.get("/console/login", include_in_schema=False)
    def login_form(request: Request, next: str = "/") -> HTMLResponse:
        return html(
            pages.login(
                page_for(request), next_path=_local(next), message=None, enabled=tokens.enabled
            )
        )

    @router.post("/console/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        # The form is parsed here (urlencoded, small): no multipart parser is needed for it.
        raw = await request.body()
        fields = parse_qs(raw[:16_384].decode("utf-8", "replace"), max_num_fields=8)
        token = (fields.get("token") or [""])[0]
        next = (fields.get("next") or ["/"])[0]
        page = page_for(request)
        grant = _grant(token.strip(), tokens.write, tokens.read)
        if grant is None:
            log.warning("console login refused", extra={"client": _client(request)})
            return html(
                pages.login(
                    page,
                    next_path=_local(next),
                    message="That is not this API's token.",
                    enabled=tokens.enabled,
                ),
                401,
            )
        response = RedirectResponse(page.root + _local(next), status_code=303)
        response.set_cookie(
            session.COOKIE,
            session.issue(grant, token.strip()),
            max_age=session.SESSION_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        log.info("console login", extra={"grant": grant, "client": _client(request)})
        return response

    @router.post("/console/logout", include_in_schema=False)
    def logout(request: Request) -> Response:
        response = RedirectResponse(page_for(request).url("/console/login"), status_code=303)
        response.delete_cookie(session.COOKIE, path="/")
        return response


def _static_files(router: APIRouter) -> None:
    """The console's stylesheet and script, and nothing else from ``static/``."""

    @router.get("/console/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in STATIC_FILES:
            return Response(status_code=404)
        return FileResponse(
            STATIC / name, media_type=STATIC_FILES[name], headers={"cache-control": "no-cache"}
        )


def _grant(token: str, write: str | None, read: str | None) -> str | None:
    """Which token this is, compared in constant time (both, every time)."""
    import hashlib
    import hmac

    given = hashlib.sha256(token.encode()).digest()
    is_write = write is not None and hmac.compare_digest(
        given, hashlib.sha256(write.encode()).digest()
    )
    is_read = read is not None and hmac.compare_digest(
        given, hashlib.sha256(read.encode()).digest()
    )
    if token and is_write:
        return "write"
    if token and is_read:
        return "read"
    return None


def _local(path: str) -> str:
    """Only a path on this site is a place to return to after login (no open redirect)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def _client(request: Request) -> str:
    return request.client.host if request.client else "-"


def login_redirect(path: str, query: str) -> str:
    """Where an unauthenticated page load is sent (the middleware's answer to a browser)."""
    target = path + (f"?{query}" if query else "")
    return f"/console/login?next={quote(target, safe='')}"
