"""Runs: one run and its status events, from the status store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.routes.models import RunDetail
from jobwheel.errors import clip

if TYPE_CHECKING:
    from jobwheel.consumers.status.store import StatusStore


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
