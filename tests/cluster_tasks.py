"""The task of the cluster fault tests: ``jobwheel worker --tasks ...,tests.cluster_tasks``.

``cluster.record`` leaves one line per execution, ``run_id attempt executed_at_ms``, so a test
counts executions by the task itself (not by what the worker reports) and measures each run's
lateness from the moment it really ran.
"""

from __future__ import annotations

import time
from pathlib import Path

from jobwheel.consumers.worker import current_run, task


@task("cluster.record")
def record(path: str) -> None:
    run = current_run()
    line = f"{run.run_id} {run.attempt} {time.time_ns() // 1_000_000}\n"
    # One short write to a file opened for appending: lines of concurrent runs never mix.
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(line)


def executions(path: Path) -> list[tuple[str, int, int]]:
    """``(run id, attempt, executed at ms)`` of every execution recorded in ``path``."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        run_id, attempt, at = line.rsplit(" ", 2)
        out.append((run_id, int(attempt), int(at)))
    return out
