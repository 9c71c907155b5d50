"""Pools and workers: each queue's worker pool as signals to scale on (``/queues``, read by
:class:`~jobwheel.consumers.status.pools.PoolReader`) and the workers as they announce
themselves on the workers topic (``/workers``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from jobwheel.consumers.status.routes.models import QueueList, WorkerList
from jobwheel.errors import BrokerError

if TYPE_CHECKING:
    from jobwheel.consumers.status.pools import PoolReader
    from jobwheel.settings import Settings


def pools_router(settings: Settings, pools: PoolReader) -> APIRouter:
    """The pools' signals and the workers' announcements."""
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

    return router
