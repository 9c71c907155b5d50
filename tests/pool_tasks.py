"""Tasks of two worker pools for the queue tests: ``jobwheel worker --tasks
tests.pool_tasks_a`` serves the queue ``alpha`` (tasks ``a.*``), ``tests.pool_tasks_b`` the
queue ``beta`` (tasks ``b.*``). Each execution leaves a line ``<run id>:<attempt> <pid>`` in the
file its arguments name, so a test counts executions and sees which process ran each."""

from __future__ import annotations

import os
from pathlib import Path

from jobwheel.consumers.worker import current_run


def note(log: str) -> dict[str, int]:
    run = current_run()
    with Path(log).open("a", encoding="utf-8") as fh:
        fh.write(f"{run.run_id}:{run.attempt} {os.getpid()}\n")
    return {"pid": os.getpid()}
