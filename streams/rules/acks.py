"""The rules of the workers' acknowledgements: STARTED and HEARTBEAT move a run's deadline,
SUCCEEDED finishes it, FAILED retries it or ends it DEAD."""

from __future__ import annotations

from jobwheel.errors import RecordTooLargeError
from jobwheel.schemas.models import (
    HANDBACK_REASON,
    State,
    StatusEvent,
)
from jobwheel.schemas.validation import MAX_DURATION_MS
from jobwheel.streams.jobstate import (
    ActiveRun,
    JobRecord,
    JobStatus,
    RunPhase,
)
from jobwheel.streams.rules.core import (
    MAX_HANDBACKS,
    TOO_LARGE,
    Output,
    ProcessorCore,
    clip_id,
    cut,
)


class AckRules(ProcessorCore):
    def on_ack(self, ev: StatusEvent, now_ms: int, ack_time_ms: int | None = None) -> Output:
        """A worker's event about a run. ``ack_time_ms`` is when it was appended to the acks
        topic (broker time; ``now_ms`` when unknown): a heartbeat extends the deadline from
        then, on the scheduler's side of the clock, not by what the worker claims. An ack
        whose change would make the job's record too large for its changelog is refused
        whole (the engine dead-letters it)."""
        try:
            return self._ack(ev, now_ms, ack_time_ms)
        except RecordTooLargeError as exc:
            out = Output(rejected=f"refused: {exc}")
            out.problems.append(TOO_LARGE)
            return out

    def _ack(self, ev: StatusEvent, now_ms: int, ack_time_ms: int | None) -> Output:
        out = Output()
        if ev.run_id is None:
            return out
        if ev.attempt < 1:
            # Attempts count from 1 (the scheduler numbers them; a worker echoes the number
            # of the run it was given). Attempt 0 or -7 is no attempt of any run: read as
            # "an older attempt" it would complete a run still running (any attempt's
            # SUCCEEDED up to the run's does). Not news of the run: refused, dead-lettered.
            out.rejected = (
                f"ack {ev.state.value} of run {clip_id(ev.run_id)!r} names attempt "
                f"{ev.attempt}: attempts count from 1"
            )
            return out
        job = self.load(ev.job_id)
        if job is None:
            return out
        run = job.active.get(ev.run_id)
        if run is None:
            return out  # finished already, or replaced
        if ev.state is State.SUCCEEDED and ev.attempt <= run.attempt:
            # Any attempt's success completes the run, even one we had given up waiting for
            # and dispatched again: the work is done (the newer attempt may run too; that is
            # the at-least-once duplicate, not a reason to keep redelivering).
            self._finish(job, run, now_ms, out)
            self.save(job)
            return out
        if run.attempt != ev.attempt or run.phase is not RunPhase.DISPATCHED:
            return out  # an older attempt's news, or a duplicate verdict
        # STARTED and HEARTBEAT are the run's signs of life: each moves its deadline to a
        # visibility timeout after it was written. STARTED matters most after a worker crash:
        # the partition's next worker runs the unfinished attempt again, and its STARTED keeps
        # the scheduler from dispatching a second copy of the same work.
        if ev.state in (State.STARTED, State.HEARTBEAT):
            at = now_ms if ack_time_ms is None else ack_time_ms
            extended = at + job.spec.visibility_timeout_ms
            changed = not run.reported
            run.reported = True
            if extended > (run.deadline_ms or run.due_ms):
                # (a deadline put off for its queue's acks is the one that moves)
                run.due_ms = max(run.due_ms, extended)
                run.deadline_ms = 0 if run.due_ms == extended else extended
                changed = True
            if changed:
                self.save(job)
        elif ev.state is State.FAILED:
            self._on_failed(job, run, ev, now_ms, out)
            self.save(job)
        return out

    def _on_failed(
        self, job: JobRecord, run: ActiveRun, ev: StatusEvent, now_ms: int, out: Output
    ) -> None:
        if ev.reason == HANDBACK_REASON and job.status is not JobStatus.CANCELLED:
            if run.handbacks < MAX_HANDBACKS:
                self._redispatch(
                    job, run, run.attempt + 1, now_ms, out, reason=HANDBACK_REASON, handback=True
                )
                return
        job.last_error = None if ev.error is None else cut(ev.error)
        retryable = ev.retry_delay_ms is not None and job.status is not JobStatus.CANCELLED
        if retryable and run.attempt < job.spec.max_attempts + run.limit_extra:
            # At most the largest duration anything in jobwheel may name: a task's
            # Retry(delay_ms=2**63 - 1) would put the retry past int64 (a timer that never
            # fires, on a job that stays SCHEDULED).
            delay = min(max(0, ev.retry_delay_ms or 0), MAX_DURATION_MS)
            run.phase = RunPhase.RETRY_WAIT
            run.due_ms = now_ms + delay
            out.status.append(
                self._event(
                    job,
                    job.job_id,
                    State.RETRYING,
                    now_ms,
                    run=run,
                    event_id=f"{run.run_id}:{run.attempt}:RETRYING",
                    error=ev.error,
                    retry_delay_ms=delay,
                    reason=f"attempt {run.attempt + 1} of {job.spec.max_attempts + run.base} "
                    f"in {delay} ms",
                )
            )
            return
        # The worker sends no retry delay both for an error not worth retrying and on the
        # last attempt it allows (its own count: the task may allow fewer than the job); its
        # reason says which, so a run whose attempts ran out never reads as "not retryable".
        last = run.attempt >= job.spec.max_attempts + run.limit_extra
        if job.status is JobStatus.CANCELLED:
            reason = "job cancelled"
        elif ev.retry_delay_ms is None and not last:
            said = f" ({ev.reason})" if ev.reason else ""
            reason = f"attempt {run.attempt} failed and is not retried{said}: {ev.error}"
        else:
            reason = (
                f"attempt {run.attempt} of {job.spec.max_attempts + run.base} failed: {ev.error}"
            )
        self._give_up(job, run, now_ms, out, State.DEAD, reason)
