"""The rules of time: fires that are due (the missed-run and concurrency rules), visibility
deadlines that expired past the acks watermark, and the next instant anything is due."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from jobwheel.errors import RecordTooLargeError, StateError
from jobwheel.schemas.models import (
    ConcurrencyPolicy,
    State,
    StatusEvent,
)
from jobwheel.streams import triggers
from jobwheel.streams.jobstate import (
    DEADLINES,
    EXPIRE,
    FIRE,
    RETRY,
    TIMERS,
    VISIBILITY,
    ActiveRun,
    JobRecord,
    JobStatus,
    RunPhase,
    parse_tag,
)
from jobwheel.streams.rules.core import (
    MAX_MISSED_EVENTS,
    QUEUE_PATIENCE,
    TIMER_FAILED,
    Output,
    ProcessorCore,
    cut,
    log,
)
from jobwheel.streams.wheel import TimingWheel, WheelEntry

#: Takes one timer's output (the engine encodes it); raises if it cannot.
Emit = Callable[[Output], None]


class Punctuation(ProcessorCore):
    def punctuate(
        self,
        now_ms: int,
        limit: int,
        deadline_watermark: int | None = None,
        max_records: int | None = None,
        reached_ms: int | None = None,
        emit: Emit | None = None,
        queue_watermark: Callable[[str], int] | None = None,
        reached_by_queue: Mapping[str, int] | None = None,
        queue_acked: Mapping[str, int] | None = None,
    ) -> tuple[Output, int]:
        """Handle up to ``limit`` due timers, stopping early once the output reaches
        ``max_records`` records (one transaction stays bounded however far behind the
        partition is); returns the output and how many timers were handled. What is left is
        still due at the next call.

        Fires, retries and expiries are due at ``now_ms``; visibility deadlines only up to
        ``deadline_watermark`` (how far the acknowledgements have been read; ``now_ms`` when
        None), so no attempt is given up while its verdict may be waiting unread.
        ``reached_ms`` is how far the partition's worker has got (the latest dispatch time of
        a run it has reported on; None: unknown): an attempt dispatched after that, or in the
        same millisecond, is still queued behind other runs, not lost, and gets another
        visibility timeout instead of a second copy (for at most :data:`QUEUE_PATIENCE`
        timeouts). The same millisecond counts as not reached unless the run itself was
        reported on: every run one punctuation fires carries its ``now``, so a report on the
        first of a burst says nothing about the rest.

        With worker pools the partition's acks come from several queues' workers, so
        ``deadline_watermark`` is the furthest any of them got. ``queue_watermark(queue)``
        says how far the acks of one queue's own workers have been read, and
        ``reached_by_queue`` how far each queue's workers got: a deadline the partition's
        watermark passed but its queue's did not is not expired (another pool's acks say
        nothing about this run; its own pool may be down with the run waiting on its topic)
        but looked at again a visibility timeout later; and the queue's own progress decides
        whether a run is still queued. Without them, the partition's (one queue). A run whose
        deadline passed while its queue was silent, once ``queue_acked`` (the append time of
        the queue's latest ack: its pool, not the silence ceiling) shows the pool back, gets
        a visibility timeout counted from now: its pool has just come back and is working
        through its backlog with several runs at once, and a run started a moment ago has
        not said so yet (quick runs send no STARTED).

        Each timer is handled whole or not at all (:meth:`_guarded`): ``emit``, when given,
        gets each timer's output as soon as it is made (the engine encodes it there), and a
        timer whose handling or output fails leaves nothing but the job's verdict on it. The
        returned output holds every timer's, emitted or not.
        """
        self._reached = reached_ms
        self._queue_watermark = queue_watermark
        self._reached_by_queue = reached_by_queue
        self._queue_acked = queue_acked
        out = Output()
        budget = max_records if max_records is not None else 1 << 62
        entries = self.state.timers.due(now_ms, limit)
        handled = self._handle_due(self.state.timers, TIMERS, entries, now_ms, out, budget, emit)
        if handled < limit and out.size < budget:
            watermark = now_ms if deadline_watermark is None else min(now_ms, deadline_watermark)
            entries = self.state.deadlines.due(watermark, limit - handled)
            handled += self._handle_due(
                self.state.deadlines, DEADLINES, entries, now_ms, out, budget, emit
            )
        return out, handled

    def next_due_ms(self, deadline_watermark: int | None = None) -> int | None:
        """When :meth:`punctuate` next has something to do by the wall clock (None: nothing
        pending). A deadline already passed but above the watermark waits for acks, not time."""
        due = self.state.timers.next_due_ms()
        deadline = self.state.deadlines.next_due_ms()
        if deadline is not None and (deadline_watermark is None or deadline <= deadline_watermark):
            due = deadline if due is None else min(due, deadline)
        return due

    def _handle_due(
        self,
        wheel: TimingWheel,
        kind: int,
        entries: list[WheelEntry],
        now_ms: int,
        out: Output,
        budget: int,
        emit: Emit | None,
    ) -> int:
        handled = 0
        for entry in entries:
            if out.size >= budget:
                break
            handled += 1
            self._guarded(entry, now_ms, out, emit)
            # Handling a timer changes the record that derives it. One that is still derived
            # (a record that could not be read, or did not move) is dropped from the index, so
            # that it cannot come back on every punctuation; so is an entry without a record.
            timers = self.state.stored_timers(entry.job_id.encode())
            if timers is None or (kind, entry.due_ms, entry.tag.encode()) in timers:
                if timers is not None:
                    log.error(
                        "timer handled but still pending; dropped",
                        extra={"job_id": entry.job_id, "tag": entry.tag, "due_ms": entry.due_ms},
                    )
                wheel.remove(entry)
        return handled

    def _guarded(self, entry: WheelEntry, now_ms: int, out: Output, emit: Emit | None) -> None:
        """One due timer, all or nothing, as commands are guarded: the record's change and
        its output (handed to ``emit``), or, when either fails (a zone this host's tzdata
        lacks, a ``ValueError`` of the trigger arithmetic, a record too large for the
        changelog, an output the codec refuses), neither: the change is rolled back and the
        job gets its verdict instead (:meth:`_poison`). Never raises: a timer that fails on
        every scheduler must not stop the partition, nor every owner it moves to."""
        key = entry.job_id.encode()
        mark = out.mark()
        point = self.state.savepoint(key)
        try:
            self._on_due(entry, now_ms, out)
            if emit is not None and out.mark() != mark:
                emit(out.since(mark))
            return
        except RecordTooLargeError as exc:
            error: Exception = exc
        except StateError:
            log.exception(
                "dropping a timer whose job state is unreadable",
                extra={"job_id": entry.job_id, "partition": self.partition},
            )
            return
        except Exception as exc:  # whatever it is, the partition goes on
            error = exc
        out.truncate(mark)
        self.state.rollback(key, point)
        log.error(
            "timer failed; its change is undone and the job gets a verdict",
            exc_info=error,
            extra={"job_id": entry.job_id, "tag": entry.tag, "partition": self.partition},
        )
        try:
            self._poison(entry, error, now_ms, out)
            out.problems.append(TIMER_FAILED)
            if emit is not None:
                emit(out.since(mark))
        except Exception:  # not even the verdict: drop the timer, go on
            out.truncate(mark)
            self.state.rollback(key, point)
            out.problems.append(TIMER_FAILED)
            log.exception(
                "timer failed and so did its verdict; the timer is dropped",
                extra={"job_id": entry.job_id, "tag": entry.tag, "partition": self.partition},
            )

    def _poison(self, entry: WheelEntry, error: Exception, now_ms: int, out: Output) -> None:
        """The verdict on a job whose timer failed: a failed fire pauses the job (PAUSED,
        naming the error: fix the job and schedule it again, or resume it once the scheduler
        can handle it); a failed run timer ends the run DEAD with the error (dead-lettered,
        so it can be replayed); a failed expiry deletes the record."""
        job = self.load(entry.job_id)
        if job is None:
            return
        kind, _, run_id = parse_tag(entry.tag)
        what = f"{type(error).__name__}: {error}"
        if kind == EXPIRE:
            self.state.delete(job.job_id.encode())
            return
        if kind == FIRE:
            if job.status is not JobStatus.ACTIVE:
                return
            job.status = JobStatus.PAUSED
            reason = cut(
                f"paused by the scheduler: its fire due at {entry.due_ms} failed ({what}); "
                "schedule the job again with a spec this scheduler can run, or resume it "
                "once the scheduler can handle it"
            )
            out.status.append(self._event(job, job.job_id, State.PAUSED, now_ms, reason=reason))
        else:
            run = job.active.get(run_id)
            if run is None:
                return
            job.active.pop(run_id)
            job.last_outcome = State.DEAD.value
            job.last_error = reason = cut(f"the scheduler could not handle the run ({what})")
            try:
                out.dead_runs.append((self._make_run(job, run, now_ms), reason))
            except Exception:  # the event says it; no copy to replay
                log.exception("a failed run cannot be dead-lettered", extra={"run_id": run_id})
            out.status.append(
                self._event(
                    job,
                    job.job_id,
                    State.DEAD,
                    now_ms,
                    run=run,
                    event_id=f"{run.run_id}:{run.attempt}:DEAD",
                    reason=reason,
                )
            )
            self._settle(job, now_ms, out)
        self.save(job)

    def _on_due(self, entry: WheelEntry, now_ms: int, out: Output) -> None:
        job = self.load(entry.job_id)
        if job is None:
            return
        if entry.tag == EXPIRE:
            if job.expires_at_ms == entry.due_ms:
                if job.active:  # a cancelled job's last run is still out: look again later
                    self._retire(job, now_ms)
                    self.save(job)
                else:
                    self.state.delete(job.job_id.encode())
            return
        kind, attempt, run_id = parse_tag(entry.tag)
        if kind == FIRE:
            if job.status is JobStatus.ACTIVE and job.next_fire_ms == entry.due_ms:
                self._fire(job, entry.due_ms, now_ms, out)
                self.save(job)
            return
        run = job.active.get(run_id)
        if run is None or run.due_ms != entry.due_ms:
            return
        if kind == VISIBILITY and run.phase is RunPhase.DISPATCHED and run.attempt == attempt:
            self._on_visibility_deadline(job, run, now_ms, out)
        elif kind == RETRY and run.phase is RunPhase.RETRY_WAIT and run.attempt + 1 == attempt:
            self._redispatch(job, run, attempt, now_ms, out, reason="retry after backoff")
        self.save(job)

    def _fire(self, job: JobRecord, scheduled_ms: int, now_ms: int, out: Output) -> None:
        spec = job.spec
        # Every instant in [scheduled_ms, now_ms] is due; only the latest may run.
        due = [scheduled_ms]
        nxt = triggers.next_fire_ms(spec.trigger, scheduled_ms)
        while nxt is not None and nxt <= now_ms:
            due.append(nxt)
            nxt = triggers.next_fire_ms(spec.trigger, nxt)
            if len(due) > 10 * MAX_MISSED_EVENTS:
                # Far behind (e.g. a 1 s interval after a day down): jump, do not iterate.
                last = triggers.last_fire_between(spec.trigger, due[-1], now_ms)
                if last is not None:
                    due.append(last)
                    nxt = triggers.next_fire_ms(spec.trigger, last)
                break
        job.next_fire_ms = nxt
        latest = due[-1]
        missed = due[:-1]
        for t in missed[:MAX_MISSED_EVENTS]:
            out.status.append(
                self._missed(
                    job,
                    t,
                    now_ms,
                    "a later scheduled time is also due; only the latest"
                    " runs (CronJob missed-schedule rule)",
                )
            )
        if len(missed) > MAX_MISSED_EVENTS:
            out.status.append(
                self._missed(
                    job,
                    missed[-1],
                    now_ms,
                    f"{len(missed) - MAX_MISSED_EVENTS} more scheduled times missed up to this one",
                )
            )
        late = now_ms - latest
        if spec.starting_deadline_ms is not None and late > spec.starting_deadline_ms:
            out.status.append(
                self._missed(
                    job,
                    latest,
                    now_ms,
                    f"{late} ms late, past the starting deadline of {spec.starting_deadline_ms} ms",
                )
            )
            job.last_outcome = State.MISSED.value
            self._settle(job, now_ms, out)
            return
        running = list(job.active.values())
        if running and spec.concurrency_policy is ConcurrencyPolicy.FORBID:
            reason = f"run {running[0].run_id} still active (concurrencyPolicy=FORBID)"
            out.status.append(self._skipped(job, latest, now_ms, reason))
            self._settle(job, now_ms, out)
            return
        crowded = self._crowded(job) if spec.concurrency_policy is ConcurrencyPolicy.ALLOW else None
        if crowded is not None:
            reason = f"{crowded} (concurrencyPolicy=ALLOW)"
            out.status.append(self._skipped(job, latest, now_ms, reason))
            return
        if running and spec.concurrency_policy is ConcurrencyPolicy.REPLACE:
            for run in running:
                job.active.pop(run.run_id, None)
                out.status.append(
                    self._event(
                        job,
                        job.job_id,
                        State.CANCELLED,
                        now_ms,
                        run=run,
                        event_id=f"{run.run_id}:{run.attempt}:CANCELLED",
                        reason=f"replaced by run {job.job_id}@{latest} (concurrencyPolicy=REPLACE)",
                    )
                )
        self._dispatch(job, f"{job.job_id}@{latest}", latest, 1, now_ms, out)

    def _missed(self, job: JobRecord, scheduled_ms: int, now_ms: int, reason: str) -> StatusEvent:
        return self._not_run(job, State.MISSED, scheduled_ms, now_ms, reason)

    def _skipped(self, job: JobRecord, scheduled_ms: int, now_ms: int, reason: str) -> StatusEvent:
        return self._not_run(job, State.SKIPPED, scheduled_ms, now_ms, reason)

    def _not_run(
        self, job: JobRecord, state: State, scheduled_ms: int, now_ms: int, reason: str
    ) -> StatusEvent:
        """The event of a fire that was not run, named by its scheduled time like the run it
        would have been (one event per fire, however often the decision is replayed)."""
        return self._event(
            job,
            job.job_id,
            state,
            now_ms,
            event_id=f"{job.job_id}@{scheduled_ms}:{state.value}",
            run_id=f"{job.job_id}@{scheduled_ms}",
            scheduled_time_ms=scheduled_ms,
            reason=reason,
        )

    def _on_visibility_deadline(
        self, job: JobRecord, run: ActiveRun, now_ms: int, out: Output
    ) -> None:
        if job.status is JobStatus.CANCELLED:
            self._give_up(job, run, now_ms, out, State.SKIPPED, "job cancelled")
            return
        timeout = job.spec.visibility_timeout_ms
        queue = job.spec.queue
        reached = self._reached
        if self._queue_watermark is not None:
            deadline = run.deadline_ms or run.due_ms
            if deadline > self._queue_watermark(queue):
                # The partition's acks passed the deadline, but not those of the run's own
                # queue: its pool has not answered up to then (none running, or stalled). Not
                # lost: looked at again later, against the deadline it had.
                run.deadline_ms = deadline
                run.due_ms = now_ms + timeout
                return
            acked = None if self._queue_acked is None else self._queue_acked.get(queue)
            if run.deadline_ms and acked is not None and acked >= run.deadline_ms:
                # Its deadline passed while its pool was away; the pool is back: the timeout
                # counts from now, as for a run just fetched.
                run.deadline_ms = 0
                run.due_ms = now_ms + timeout
                return
        if self._reached_by_queue is not None:
            reached = self._reached_by_queue.get(queue)
        if (
            reached is not None
            and (run.dispatched_ms > reached or (run.dispatched_ms == reached and not run.reported))
            and now_ms - run.dispatched_ms < QUEUE_PATIENCE * timeout
        ):
            # Not yet reached by the queue's worker (it starts runs in dispatch order):
            # waiting behind a backlog, not lost. A copy would only join the same queue. A tie
            # is not reached unless the worker said this run started: the runs of one
            # punctuation share their dispatch time, and a worker that reported on one of them
            # may not have started the next.
            run.due_ms = now_ms + timeout
            run.deadline_ms = 0
            return
        if run.attempt < job.spec.max_attempts + run.limit_extra:
            self._redispatch(
                job,
                run,
                run.attempt + 1,
                now_ms,
                out,
                reason=f"visibility timeout: attempt {run.attempt} not finished by its deadline",
            )
        else:
            self._give_up(
                job,
                run,
                now_ms,
                out,
                State.DEAD,
                f"visibility timeout expired on attempt {run.attempt} of "
                f"{job.spec.max_attempts + run.base}",
            )
