"""Tasks for the tests: ``jobwheel worker --tasks jobwheel.consumers.demo,tests.tasks``.

They block on a *gate*, a file the test creates when it wants the task to finish, instead of
sleeping: a test then decides the order of events (the run is executing now, the worker is
killed now, the run finishes now) rather than hoping a sleep is long enough on a loaded machine.
Each task can leave a line ``run_id:attempt`` in a file when it starts (``started``) and when it
finishes (``finished``), so a test can wait for and count executions.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from jobwheel.consumers.worker import current_run, heartbeat, task
from jobwheel.errors import Retry

POLL_S = 0.02


def _mark(path: str | None) -> None:
    if path is not None:
        run = current_run()
        with Path(path).open("a", encoding="utf-8") as fh:
            fh.write(f"{run.run_id}:{run.attempt}\n")


@task("test.gate")
def gate(
    gate: str,
    started: str | None = None,
    finished: str | None = None,
    beat: bool = False,
) -> dict[str, int]:
    """Note the start, call ``heartbeat()`` once if ``beat``, block (in a worker thread) until
    the file ``gate`` exists, note the finish."""
    _mark(started)
    if beat:
        heartbeat()
    while not Path(gate).exists():
        time.sleep(POLL_S)
    _mark(finished)
    return {"attempt": current_run().attempt}


@task("test.gate_async")
async def gate_async(
    gate: str,
    started: str | None = None,
    finished: str | None = None,
    beat: bool = False,
) -> dict[str, int]:
    """:func:`gate` as a coroutine (it blocks on the event loop's timer, not a thread)."""
    _mark(started)
    if beat:
        heartbeat()
    # Polling a file on purpose: the gate is opened by another process (the test). A stat
    # every 20 ms does not block the loop in any way that matters here.
    while not Path(gate).exists():  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(POLL_S)
    _mark(finished)
    return {"attempt": current_run().attempt}


@task("test.switch")
def switch(fail_if: str, gate: str | None = None, started: str | None = None) -> str:
    """Note the start, wait for ``gate`` if given, then fail if the file ``fail_if`` exists and
    succeed if it does not: a test decides each run's outcome, and when it ends."""
    _mark(started)
    while gate is not None and not Path(gate).exists():
        time.sleep(POLL_S)
    if Path(fail_if).exists():
        raise RuntimeError(f"test.switch: {fail_if} exists")
    return "ok"


@task("test.undecodable_name")
def undecodable_name(fail: bool = False) -> dict[str, str]:
    """A text that is not valid Unicode in the task's error (``fail``) or result: a file name
    whose bytes are not UTF-8, as ``os.fsdecode`` and ``os.listdir`` give it (a lone surrogate
    per undecodable byte)."""
    name = os.fsdecode(b"report-\xff.txt")
    if fail:
        raise FileNotFoundError(f"no such file: {name}")
    return {"name": name}


class Unprintable(Exception):
    """An exception whose ``str()`` raises: a task's own exception class with a broken
    ``__str__`` (a lazy message that fails to format)."""

    def __str__(self) -> str:
        raise RuntimeError("the message cannot be formatted")


class Opaque:
    """A value that neither ``str()`` nor ``repr()`` can turn into text."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Abort(BaseException):
    """A library's own BaseException (pytest's Failed, gevent's GreenletExit, trio's
    Cancelled): not an Exception, so ``except Exception`` lets it through."""


@task("test.hostile_outcome")
async def hostile_outcome(kind: str) -> object:
    """An async task whose outcome the worker cannot simply print: ``unprintable`` raises an
    exception whose ``str()`` raises, ``opaque`` returns a value neither ``str()`` nor ``repr()``
    can print, ``huge`` returns an int with more digits than ``str()`` converts, ``cancelled``
    raises ``CancelledError`` from an awaited future that something else cancelled. Or one the
    contract cannot carry as given: ``base`` raises a BaseException that is not an Exception,
    ``float_retry`` asks for a retry in 1500.5 ms, ``far_retry`` in 10**20 ms, ``long_reason``
    with a 2,000,000-character reason (past the broker's record size); ``self_cancel`` cancels
    its own asyncio task."""
    if kind == "unprintable":
        raise Unprintable()
    if kind == "base":
        raise Abort("stop right here")
    if kind == "float_retry":
        raise Retry(delay_ms=1500.5)
    if kind == "far_retry":
        raise Retry(delay_ms=10**20)
    if kind == "long_reason":
        raise Retry(reason="x" * 2_000_000)
    if kind == "self_cancel":
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        await asyncio.sleep(1)
    if kind == "opaque":
        return {"value": Opaque()}
    if kind == "huge":
        return {"value": 10**5000}
    if kind == "cancelled":
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future
    raise ValueError(f"unknown kind {kind!r}")


async def _forgot_async() -> str:
    return "never ran"


@task("test.returns_coroutine")
def returns_coroutine() -> object:
    """A plain function that returns a coroutine (an async function behind a decorator that
    lost its ``functools.wraps``): its body never runs, which must not read as a success."""
    return _forgot_async()


@task("test.stubborn", timeout=0.3)
async def stubborn(started: str) -> None:
    """Ignores every cancellation (its time limit, the worker's hand-back) and leaves a
    non-daemon thread running: neither may keep the worker from its verdict or its exit."""
    threading.Thread(target=time.sleep, args=(3600,), name="task-thread").start()
    Path(started).touch()  # noqa: ASYNC240 (a test task: one small file)
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass


@task("test.blocks_loop")
async def blocks_loop(started: str) -> None:
    """Blocks the worker's event loop for an hour (``time.sleep`` in a coroutine): no
    cancellation, timer or signal handled by the loop can reach the worker while it runs."""
    Path(started).touch()  # noqa: ASYNC240 (a test task: one small file)
    time.sleep(3600)  # noqa: ASYNC251 (the point of this task)


@task("test.stops_loop")
async def stops_loop() -> str:
    """Stops the worker's event loop from inside a task."""
    asyncio.get_running_loop().stop()
    await asyncio.sleep(0.1)
    return "after the stop"
