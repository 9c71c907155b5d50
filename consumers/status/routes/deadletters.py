"""Dead letters: read from the dead-letter topic in Kafka, marked when the status store shows
them replayed already, and replayed through the JobClient."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.routes.models import KINDS_DOC, DeadLetters, ReplayRequest, Replays
from jobwheel.errors import ValidationError

if TYPE_CHECKING:
    from jobwheel.consumers.status.api import _Clients
    from jobwheel.consumers.status.store import StatusStore
    from jobwheel.settings import Settings


def dead_letters_router(settings: Settings, store: StatusStore, clients: _Clients) -> APIRouter:
    """Dead letters: read them from the dead-letter topic and replay them."""
    router = APIRouter()

    @router.get("/dead-letters", response_model=DeadLetters, tags=["dead letters"])
    def list_dead_letters(
        since: Annotated[str | None, Query(description="an age (2h), ISO 8601, epoch ms")] = None,
        task: str | None = None,
        reason: Annotated[str | None, Query(description="part of the error text")] = None,
        job: str | None = None,
        kind: Annotated[str | None, Query(description=KINDS_DOC)] = None,
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
