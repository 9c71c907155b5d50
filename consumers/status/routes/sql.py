"""``POST /sql``: one read-only statement against the status store
(:class:`~jobwheel.consumers.status.sql.SqlRunner` decides what may run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.encoders import jsonable_encoder

from jobwheel.consumers.status.routes.models import SqlRequest, SqlResponse

if TYPE_CHECKING:
    from jobwheel.consumers.status.sql import SqlRunner


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
