"""Builders for the status store tests, and the generators behind their fixtures.

chdb hosts one engine directory per process, so the whole pytest session shares one embedded
engine and each test gets its own database in it: isolation without re-opening the engine.
A test module wraps the generators in two fixtures:

    @pytest.fixture(scope="session")
    def engine_dsn(tmp_path_factory):
        yield from status_support.engine(tmp_path_factory)

    @pytest.fixture
    def store(engine_dsn):
        yield from status_support.fresh_store(engine_dsn)
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from jobwheel.consumers.status.store import StatusStore
from jobwheel.schemas.models import State, StatusEvent

_ids = itertools.count(1)


def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's embedded engine; a client stays open so it is initialised only once."""
    path = tmp_path_factory.getbasetemp() / "status-chdb"
    dsn = f"chdb://{path}"
    keeper = StatusStore.open(dsn, database="keeper", migrate=False)
    yield dsn
    keeper.close()


def fresh_store(dsn: str) -> Iterator[StatusStore]:
    """A migrated store in a database of its own, dropped afterwards."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    store = StatusStore.open(dsn, database=database, ttl_days=30)
    yield store
    store.client.command(f"DROP DATABASE IF EXISTS {database} SYNC")
    store.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def event(
    job_id: str,
    state: State | str,
    *,
    seq: int,
    t: int,
    source: str | None = None,
    run_id: str | None = None,
    event_id: str | None = None,
    **fields: Any,
) -> StatusEvent:
    """A StatusEvent with sensible defaults: worker states come from a worker, others not."""
    state = State(state)
    worker_states = {State.STARTED, State.HEARTBEAT, State.SUCCEEDED, State.FAILED}
    if source is None:
        source = "worker" if state in worker_states else "scheduler"
    return StatusEvent(
        event_id=event_id or f"ev-{next(_ids)}",
        job_id=job_id,
        state=state,
        event_time_ms=t,
        source=source,
        run_id=run_id,
        seq=seq,
        **fields,
    )


def lifecycle(job_id: str, t0: int, *, task: str = "demo.echo") -> list[StatusEvent]:
    """A one-shot job's life: scheduled, dispatched 7 ms late, run by a worker, completed."""
    run = f"{job_id}@{t0 + 1000}"
    return [
        event(job_id, State.SCHEDULED, seq=1, t=t0, task=task, next_fire_ms=t0 + 1000),
        event(
            job_id,
            State.DISPATCHED,
            seq=2,
            t=t0 + 1007,
            run_id=run,
            attempt=1,
            task=task,
            scheduled_time_ms=t0 + 1000,
            deadline_ms=t0 + 31_007,
        ),
        event(job_id, State.STARTED, seq=2, t=t0 + 1010, run_id=run, attempt=1, worker="w:1"),
        event(
            job_id,
            State.HEARTBEAT,
            seq=2,
            t=t0 + 1100,
            run_id=run,
            attempt=1,
            worker="w:1",
            deadline_ms=t0 + 31_100,
        ),
        event(
            job_id,
            State.SUCCEEDED,
            seq=2,
            t=t0 + 1110,
            run_id=run,
            attempt=1,
            worker="w:1",
            duration_ms=100,
            result_json='{"ok": true}',
        ),
        event(job_id, State.COMPLETED, seq=3, t=t0 + 1111),
    ]
