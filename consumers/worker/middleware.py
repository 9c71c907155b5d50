"""Hooks around run processing, for side effects that are not the delivery protocol.

After dramatiq's middleware: a base class of no-op hooks and a default list. Metrics, tracing or
extra logging plug in here without touching the pool. What is *not* middleware, on purpose:
status events (their delivery gates the offset commit, so they are part of the pool's
at-least-once protocol) and retries/time limits (the scheduler owns retries; the executor only
computes the FAILED event's ``retry_delay_ms``). A hook that raises is logged and ignored: an
observer must not fail a run.
"""

from __future__ import annotations

import logging

from jobwheel.consumers.worker.executor import Outcome
from jobwheel.schemas.models import Run, State

log = logging.getLogger(__name__)


class Middleware:
    """Override the hooks you need; each is called on the event loop, so keep them fast."""

    def before_process(self, run: Run) -> None:
        """The run is about to execute (its STARTED event follows unless it ends quickly)."""

    def after_process(self, run: Run, outcome: Outcome) -> None:
        """The run reached SUCCEEDED or FAILED and its event was delivered."""

    def after_skip(self, run: Run, state: State | None, reason: str) -> None:
        """The run was not executed: STALE (``state``) or a duplicate delivery (``None``)."""


class LoggingMiddleware(Middleware):
    """One structured line per state change: the trail operators grep by run_id.

    Every per-run line is at DEBUG (``JOBWHEEL_LOG_LEVEL=DEBUG`` for the full trail): a line
    per run costs more CPU than running a small task, a flaky task would flood the log (and
    the terminal of ``jobwheel up``), and the status store has every event anyway. What an
    operator watches is counted instead (``jobwheel_worker_runs_total{task,state}``), and a
    run that fails for good is one INFO line of the scheduler's ("run dead-lettered").
    """

    def before_process(self, run: Run) -> None:
        if not log.isEnabledFor(logging.DEBUG):
            return
        log.debug(
            "run started",
            extra={
                "run_id": run.run_id,
                "attempt": run.attempt,
                "state": State.STARTED.value,
                "task": run.task,
            },
        )

    def after_process(self, run: Run, outcome: Outcome) -> None:
        if not log.isEnabledFor(logging.DEBUG):
            return
        extra = {
            "run_id": run.run_id,
            "attempt": run.attempt,
            "state": outcome.state.value,
            "task": run.task,
            "duration_ms": outcome.duration_ms,
        }
        if outcome.state is State.SUCCEEDED:
            log.debug("run succeeded", extra=extra)
        else:
            extra.update(
                error=outcome.error, reason=outcome.reason, retry_delay_ms=outcome.retry_delay_ms
            )
            log.debug("run failed", extra=extra)

    def after_skip(self, run: Run, state: State | None, reason: str) -> None:
        if not log.isEnabledFor(logging.DEBUG):
            return
        log.debug(
            "run skipped",
            extra={
                "run_id": run.run_id,
                "attempt": run.attempt,
                "state": state.value if state else "DUPLICATE",
                "task": run.task,
                "reason": reason,
            },
        )


def default_middleware() -> list[Middleware]:
    return [LoggingMiddleware()]
