"""``GET /health``: the store answers, and the in-process sink (embedded mode) runs. Public:
the bearer-token middleware lets it through without a token."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from jobwheel.consumers.status.routes.models import Health

if TYPE_CHECKING:
    from jobwheel.consumers.status.sink import StatusSink
    from jobwheel.consumers.status.store import StatusStore


def health_router(store: StatusStore, sink: StatusSink | None) -> APIRouter:
    """Health of the store and of the sink running in this process, if any."""
    router = APIRouter()

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
