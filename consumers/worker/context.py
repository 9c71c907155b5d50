"""What a running task can ask about itself: :func:`current_run` and :func:`heartbeat`.

A context variable rather than an extra argument, so task signatures stay the user's own (their
arguments are exactly the run's ``args_json``). The executor sets it in the asyncio task of the
run and copies it into the worker thread for sync tasks, so both kinds see their own run.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass

from jobwheel.errors import TaskError
from jobwheel.schemas.models import Run


@dataclass(frozen=True, slots=True)
class RunContext:
    """The run being executed and a thread-safe way to report liveness for it."""

    run: Run
    heartbeat: Callable[[], None]


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "jobwheel_run", default=None
)


def _context(caller: str) -> RunContext:
    ctx = _current.get()
    if ctx is None:
        raise TaskError(f"{caller}() was called outside a running task; call it from task code")
    return ctx


def current_run() -> Run:
    """The Run being executed by the calling task (its ``attempt``, ``run_id``, ``job_id`` ...)."""
    return _context("current_run").run


def heartbeat() -> None:
    """Tell the scheduler this run is alive, extending its visibility deadline.

    The pool already heartbeats every third of the visibility timeout while a run executes; call
    this from long steps when you want liveness tied to progress. Calls are rate limited, so
    calling it in a tight loop is harmless. Safe from sync tasks (worker threads) and async tasks.
    """
    _context("heartbeat").heartbeat()


def set_context(ctx: RunContext) -> contextvars.Token[RunContext | None]:
    return _current.set(ctx)


def reset_context(token: contextvars.Token[RunContext | None]) -> None:
    _current.reset(token)
