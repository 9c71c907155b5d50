"""Running tasks: starting what is ready within the concurrency, async and sync tasks, their
time limits and heartbeats, their outcomes."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time

from jobwheel.consumers.worker.context import RunContext, reset_context, set_context
from jobwheel.consumers.worker.executor import Outcome, Prepared, format_error
from jobwheel.consumers.worker.pooling.core import (
    SWEEP_INTERVAL_S,
    PoolCore,
    _Execution,
    log,
)
from jobwheel.schemas import workers as roster
from jobwheel.schemas.models import HANDBACK_REASON, Run, State

#: How long past its time limit an async task that swallowed its cancellation (``except
#: CancelledError: pass`` in a loop) may run before it is reported FAILED as timed out anyway.
ASYNC_TIMEOUT_GRACE_S = 1.0


def _late(run: Run, now_ms: int) -> bool:
    """The run starts in the second half of its visibility window (it waited in a backlog, or
    for the broker): its STARTED goes at once, not after the quick-run time. The scheduler
    gives up on a run once acks read past its deadline come from runs dispatched later, and a
    run of this worker's started after this one may end first: its verdict would overtake this
    run's own word and this run be copied while it runs. Half the window leaves room for the
    distance between this clock and the scheduler's."""
    return now_ms >= run.deadline_ms - run.visibility_timeout_ms // 2


class Execution(PoolCore):
    def _start_ready(self) -> None:
        """Start waiting runs while slots are free (after a fetch and whenever a run ends)."""
        while self._running < self.concurrency and self._backlog and not self._draining:
            ex = self._backlog.popleft()
            if not self._room.is_set() and len(self._backlog) <= self._high_water // 2:
                self._room.set()
            if all(tracker.revoked or tracker.closing for tracker, _ in ex.offsets):
                self._inflight.pop(ex.key, None)  # the partition moves: its new owner runs it
                continue
            newer = self._latest.newer_attempt(ex.run.run_id, ex.run.attempt)
            if newer is not None:
                self._inflight.pop(ex.key, None)
                reason = (
                    f"stale attempt: {ex.run.attempt} < {newer}, a newer attempt of this run "
                    "arrived while it waited"
                )
                self._stale(ex.run, ex.offsets, reason)
                continue
            self._start(ex)

    def _say_unknown_task(self, run: Run) -> None:
        """One warning per task name this worker lacks (not per run: a recurring job of a
        typo'd name would fill the terminal): its runs end DEAD here without a word otherwise,
        and the worker's terminal is where whoever started it with other --tasks looks."""
        if run.task in self.unknown_tasks_said:
            return
        self.unknown_tasks_said.add(run.task)
        names = self.registry.names()
        guess = roster.did_you_mean(run.task, names)
        log.warning(
            "got a run of a task this worker does not serve: its runs fail here without "
            "retrying (DEAD); said once per task name",
            extra={
                "task": run.task,
                "job_id": run.job_id,
                "run_id": run.run_id,
                "tasks": self.registry.describe(),
                **({"did_you_mean": guess} if guess else {}),
                "fix": "start every worker of the group with the same --tasks modules, or "
                "correct the job's task (jobwheel submit --id JOB --task NAME)",
            },
        )

    def _start(self, ex: _Execution) -> None:
        run = ex.run
        ex.started = time.monotonic()
        ex.started_ms = started_ms = self._clock.now_ms()
        prepared = self._executor.prepare(run, ex.started)
        if isinstance(prepared, Outcome):  # unknown task, bad arguments: it never starts
            if run.task not in self.registry:
                self._say_unknown_task(run)
            ex.started_ms = None
            self._finish(ex, prepared)
            return
        loop = self._loop
        assert loop is not None
        self._running += 1
        ex.holds_slot = True
        ex.prepared = prepared
        with self._lock:  # a revoke now waits for this run (or hands it back)
            for tracker, offset in ex.offsets:
                tracker.own(offset)
        ex.beat_interval = max(0.05, run.visibility_timeout_ms / 3000)
        ex.next_beat = ex.started + ex.beat_interval
        self._active.add(ex)
        self._hook("before_process", run)
        if ex.repeat:
            log.warning(
                "run possibly executed before by the partition's previous owner",
                extra={"run_id": run.run_id, "attempt": run.attempt},
            )
        if self._started_event_s == 0 or ex.repeat or _late(run, started_ms):
            self._send_started(ex)
        if prepared.spec.is_async:
            if prepared.timeout_ms:  # asyncio.timeout's; this one is for a task ignoring it
                ex.deadline = ex.started + prepared.timeout_ms / 1000 + ASYNC_TIMEOUT_GRACE_S
            ex.task = loop.create_task(self._run_async(ex, prepared))
            return
        if prepared.timeout_ms:
            ex.deadline = ex.started + prepared.timeout_ms / 1000
        token = set_context(RunContext(run=run, heartbeat=functools.partial(self._beat, ex)))
        try:
            ctx = contextvars.copy_context()
        finally:
            reset_context(token)
        ex.thread = self._task_threads.submit(ctx.run, self._call_sync, ex, prepared)
        self._executor.track_thread(ex.thread)

    async def _run_async(self, ex: _Execution, prepared: Prepared) -> None:
        try:
            outcome = await self._executor.run_async(
                ex.run, prepared, functools.partial(self._beat, ex), ex.started
            )
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            if ex.handing_back:
                outcome = self._hand_back_outcome(ex)
            elif ex.outcome is not None:  # has its verdict (timed out): the worker is closing
                raise
            else:
                # The worker cancels a run only to hand it back: this came from the task's
                # own code (asyncio.current_task().cancel()). Its failure; before, the run
                # waited without a verdict until the worker stopped.
                duration_ms = int((time.monotonic() - ex.started) * 1000)
                outcome = self._executor.failure(ex.run, prepared, duration_ms, exc)
        except BaseException as exc:  # whatever escapes the executor is the run's failure
            outcome = Outcome(State.FAILED, 0, error=format_error(exc), reason="worker error")
        if ex.outcome is not None and ex.holds_slot:
            # It was given its verdict while it still ran (over its time limit, or handed
            # back while ignoring its cancellation): its slot is free only now.
            ex.holds_slot = False
            self._running -= 1
        self._finish(ex, outcome)
        self._start_ready()

    def _call_sync(self, ex: _Execution, prepared: Prepared) -> None:
        """In a task thread: call the function, hand the outcome to the loop."""
        try:
            outcome = self._executor.call_sync(ex.run, prepared, ex.started)
        except BaseException as exc:  # whatever escapes the executor is the run's failure
            outcome = Outcome(State.FAILED, 0, error=format_error(exc), reason="worker error")
        self._completions.append((ex, outcome))
        if not self._wake_pending:
            self._wake_pending = True
            self._threadsafe(self._drain_completions)

    def _drain_completions(self) -> None:
        self._wake_pending = False
        while self._completions:
            ex, outcome = self._completions.popleft()
            if ex.outcome is None:
                self._finish(ex, outcome)
            elif ex.holds_slot:  # timed out earlier; its thread has now returned
                ex.holds_slot = False
                self._running -= 1
        self._start_ready()

    def _finish(self, ex: _Execution, outcome: Outcome) -> None:
        """The run's verdict: free its slot (a timed-out sync task keeps it until its thread
        returns) and send the terminal event; the broker's acknowledgement completes it.
        Callers start the next runs (not here: a row of runs that cannot start would recurse)."""
        if ex.outcome is not None:
            return
        ex.outcome = outcome
        self._active.discard(ex)
        self.meters.verdict(
            ex.run.task,
            outcome.state.value,
            outcome.duration_ms if ex.started_ms is not None else None,
        )
        if outcome.reason == HANDBACK_REASON:
            self.meters.handed_back += 1
        if ex.holds_slot and (outcome.lingering is None or self._draining):
            ex.holds_slot = False
            self._running -= 1
        started_ms = ex.started_ms if not ex.started_sent else None
        try:
            record = self._record(
                self._event(
                    ex.run,
                    outcome.state,
                    duration_ms=outcome.duration_ms,
                    result_json=outcome.result_json,
                    error=outcome.error,
                    reason=outcome.reason,
                    retry_delay_ms=outcome.retry_delay_ms,
                    started_ms=started_ms,
                ),
                ex.run,
            )
        except Exception as exc:
            # The last resort for an outcome the contract cannot carry (the known ones are
            # cleaned in Outcome): without a verdict the run would hold its partition's
            # offsets for good. FAILED with the reason, no task texts, not retried.
            log.exception(
                "verdict could not be encoded; sending a plain FAILED",
                extra={"run_id": ex.run.run_id, "attempt": ex.run.attempt},
            )
            record = self._record(
                self._event(
                    ex.run,
                    State.FAILED,
                    duration_ms=max(0, outcome.duration_ms),
                    error=f"WorkerError: the outcome could not be encoded ({type(exc).__name__})",
                    reason=f"worker error: its {outcome.state.value} verdict could not be encoded "
                    "(see the worker's log); not retried",
                    started_ms=started_ms,
                ),
                ex.run,
            )
        self._send_verdict(ex, record)
        if self._draining and not self._active:
            self._idle.set()

    def _sweep(self) -> None:
        """Every SWEEP_INTERVAL_S: STARTED for runs past the quick-run time, heartbeats every
        third of the visibility timeout, sync tasks over their time limit. One timer for all
        runs instead of timers per run."""
        now = time.monotonic()
        self.turned_at = now
        for ex in list(self._active):
            if ex.outcome is not None:
                continue
            if not ex.started_sent and now - ex.started >= self._started_event_s:
                self._send_started(ex)
            if now >= ex.next_beat:
                ex.next_beat = now + ex.beat_interval
                self._heartbeat(ex, explicit=False)
            if ex.deadline is not None and now >= ex.deadline and ex.prepared is not None:
                duration_ms = int((now - ex.started) * 1000)
                running = ex.thread if ex.thread is not None else ex.task
                self._finish(
                    ex, self._executor.timed_out(ex.run, ex.prepared, duration_ms, running)
                )
        if not self._closing and self._loop is not None:
            self._sweeper = self._loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    def _beat(self, ex: _Execution) -> None:
        """``heartbeat()`` called by task code, from a task thread or the loop."""
        self._threadsafe(self._heartbeat, ex, True)

    def _heartbeat(self, ex: _Execution, explicit: bool) -> None:
        if ex.outcome is not None or self._closing:
            return
        now = self._clock.now_ms()
        # Explicit calls are rate limited: a task calling heartbeat() in a loop must not flood
        # the acks topic; a tenth of the visibility timeout keeps deadlines comfortably fresh.
        if explicit and now - ex.last_heartbeat_ms < max(100, ex.run.visibility_timeout_ms // 10):
            return
        if not ex.started_sent:
            self._send_started(ex)  # a heartbeat never comes before its STARTED
        ex.heartbeats += 1
        ex.last_heartbeat_ms = now
        event = self._event(
            ex.run,
            State.HEARTBEAT,
            suffix=f":{ex.heartbeats}",
            now_ms=now,  # the deadline is "this heartbeat + the visibility timeout"
            deadline_ms=now + ex.run.visibility_timeout_ms,
        )
        self._send_info(ex, event)

    def _hand_back_revoked(self) -> None:
        """A revoke's grace period is over: hand back the runs of the revoked partitions that
        still execute (FAILED, retried at once with a new attempt), so the partitions move with
        every run accounted for. A sync task's thread cannot be stopped: it goes on, its
        outcome ignored."""
        for ex in list(self._active):
            if not any(tracker.closing for tracker, _ in ex.offsets):
                continue
            log.warning(
                "run handed back",
                extra={
                    "run_id": ex.run.run_id,
                    "attempt": ex.run.attempt,
                    "reason": "partition revoked",
                },
            )
            ex.handing_back = True
            if ex.task is not None and not ex.task.done():
                ex.task.cancel()
            self._finish(
                ex,
                self._hand_back_outcome(
                    ex, "WorkerRebalance: the run's partition moved to another worker"
                ),
            )
        self._start_ready()

    def _hand_back_outcome(
        self,
        ex: _Execution,
        error: str = "WorkerShutdown: the worker stopped before the run finished",
    ) -> Outcome:
        return Outcome(
            State.FAILED,
            int((time.monotonic() - ex.started) * 1000),
            error=error,
            reason=HANDBACK_REASON,
            retry_delay_ms=0,
        )
