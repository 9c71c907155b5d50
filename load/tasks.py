"""Tasks of the load tests: ``jobwheel worker --tasks load.tasks``.

``load.noop`` is the end-to-end generator's task (``python -m load.e2e``): it does nothing but
note when it started, so what the generator measures is jobwheel, not the task. The note is one
``write`` of one line to a file of this process (``O_APPEND``, no buffering), so a line is on
disk the moment the task returns and a SIGKILLed worker loses none it reported.
"""

from __future__ import annotations

import os
import time
from typing import Any

from jobwheel.consumers.worker import current_run, task

_files: dict[str, int] = {}


def _record_fd(directory: str) -> int:
    fd = _files.get(directory)
    if fd is None:
        path = os.path.join(directory, f"starts-{os.getpid()}.txt")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _files[directory] = fd
    return fd


def record_start(directory: str) -> None:
    """Append ``run_id attempt scheduled_ms start_ns pid`` for the running task."""
    started_ns = time.time_ns()
    run = current_run()
    line = f"{run.run_id} {run.attempt} {run.scheduled_time_ms} {started_ns} {os.getpid()}\n"
    os.write(_record_fd(directory), line.encode())


@task("load.noop")
async def noop(out: str | None = None, **_: Any) -> None:
    """Nothing but the start note (when ``out`` names a directory). Async, so the worker runs
    it on its event loop without a thread hand-off."""
    if out is not None:
        record_start(out)


@task("load.noop_sync")
def noop_sync(out: str | None = None, **_: Any) -> None:
    """The same as a plain function: it runs in the worker's thread pool."""
    if out is not None:
        record_start(out)
