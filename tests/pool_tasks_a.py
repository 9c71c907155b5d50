"""Pool A's tasks (queue ``alpha``); see :mod:`tests.pool_tasks`."""

from __future__ import annotations

from jobwheel.consumers.worker import task
from tests.pool_tasks import note


@task("a.work", queue="alpha")
def work(log: str) -> dict[str, int]:
    return note(log)
