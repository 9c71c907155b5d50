"""Jobs: ``POST /jobs`` and the commands on one job (sent to Kafka through the JobClient), one
job's state, runs and command answers, the list of jobs and ``/stats/states`` (from the status
store)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import JSONResponse

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.routes.models import (
    Accepted,
    CommandVerdict,
    ControlRequest,
    JobDetail,
    JobList,
    JobRuns,
    ScheduleRequest,
    StateCounts,
    schedule_spec,
)
from jobwheel.errors import clip
from jobwheel.schemas.models import trigger_run_id

if TYPE_CHECKING:
    from jobwheel.consumers.status.api import _Clients
    from jobwheel.consumers.status.store import StatusStore
    from jobwheel.settings import Settings


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
