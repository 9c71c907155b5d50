"""Pool B's tasks (queue ``beta``); see :mod:`tests.pool_tasks`."""

from __future__ import annotations

from jobwheel.consumers.worker import task
from tests.pool_tasks import note


@task("b.work", queue="beta")
def work(log: str) -> dict[str, int]:
    return note(log)
