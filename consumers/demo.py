"""Example tasks: ``jobwheel worker --tasks jobwheel.consumers.demo``.

Small on purpose; the tests and the benchmark drive the worker with them. ``demo.flaky`` decides
by the run's attempt number (``current_run().attempt``) so it needs no shared state, and
``demo.count`` leaves a line per execution in a file, so tests can count executions.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from jobwheel.consumers.worker import current_run, task


@task("demo.echo")
def echo(*args: Any, **kwargs: Any) -> Any:
    """Return the arguments: the object (as kwargs) or the list (as positional args)."""
    if args and kwargs:
        return {"args": list(args), "kwargs": kwargs}
    return list(args) if args else kwargs


@task("demo.sleep")
async def sleep(seconds: float = 1.0, **_: Any) -> dict[str, float]:
    """Sleep without blocking the worker; the pool heartbeats while it runs."""
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@task("demo.fail")
def fail(message: str = "demo.fail always fails", **_: Any) -> None:
    """Always raise, to exercise retries and DEAD runs."""
    raise RuntimeError(message)


@task("demo.flaky")
def flaky(failures: int = 1, **_: Any) -> dict[str, int]:
    """Fail the first ``failures`` attempts, then succeed."""
    attempt = current_run().attempt
    if attempt <= failures:
        raise RuntimeError(f"demo.flaky: attempt {attempt} fails (first {failures} do)")
    return {"attempt": attempt}


@task("demo.count")
def count(path: str, sleep_s: float = 0.0, **_: Any) -> int:
    """Append ``run_id:attempt`` to the file ``path`` (then sleep ``sleep_s``); returns how many
    lines the file has."""
    run = current_run()
    target = Path(path)
    with target.open("a", encoding="utf-8") as fh:
        fh.write(f"{run.run_id}:{run.attempt}\n")
    if sleep_s:
        time.sleep(sleep_s)
    return len(target.read_text(encoding="utf-8").splitlines())
