"""The scheduler's decisions for one partition, as a pure processor.

No Kafka, no clock: the engine (:mod:`jobwheel.streams.engine`) hands it decoded records and the
current
time, and it returns what to produce. State lives in the injected :class:`PartitionState`, whose
job records also derive the timing wheels. This is where every rule of the scheduler is, so it
is unit-tested record by record with a manual clock.

Rules, in the words of Kubernetes CronJob and SQS:

- A fire at scheduled time ``T`` handled at ``now``: all scheduled instants in ``[T, now]`` are
  due. Only the latest runs; each earlier one leaves a MISSED event (at most
  ``MAX_MISSED_EVENTS``, then one summary). If ``startingDeadline`` is set and the latest is
  later than that after its time, it is MISSED too.
- ``concurrencyPolicy``: ALLOW runs regardless; FORBID leaves a SKIPPED event while a run of the
  job is active; REPLACE cancels the active runs (CANCELLED events with their run ids) and runs.
- A dispatched attempt not SUCCEEDED/FAILED by its visibility deadline is dispatched again
  (attempt + 1) until ``max_attempts``; STARTED and HEARTBEAT move the deadline. The deadline
  is the scheduler's: dispatch time (or the broker append time of the run's latest sign of life)
  plus the visibility timeout, and it only expires once the acknowledgements up to it have been
  read (``deadline_watermark`` of :meth:`SchedulerProcessor.punctuate`): a scheduler that lags
  never re-dispatches a run whose verdict is already on the acks topic, and while the worker
  side of the partition is silent nothing is re-dispatched into a queue nobody reads. FAILED
  with a ``retry_delay_ms`` from the worker is retried after that delay; without one, or out
  of attempts, the run is DEAD (status event, and the run on the dead-letter topic).
- Paused jobs do not fire; on resume the pending fire is due again, so what was missed while
  paused follows the missed-run rule above (as with ``suspend`` on a CronJob).
- Manual triggers always run (as ``kubectl create job --from=cronjob``), whatever the policy,
  and change nothing about the job: a paused job stays PAUSED, a finished one stays finished
  until the triggered run ends (then its outcome decides COMPLETED or DEAD again).
- A dead-letter replay (``ReplayRun``) dispatches a DEAD run again like a manual trigger, but
  as the same run: same run id and scheduled time, the next attempt, and ``max_attempts``
  attempts of its own. Its DISPATCHED event says it is a replay (event id
  ``<command id>:DISPATCHED``, the command's verdict). It runs the job's current definition; a
  job the scheduler has forgotten (finished longer ago than the retention) is recreated, DEAD,
  from the dead run's own task and arguments, with its sequence numbers continued from the
  command's issue time so its new events sort after the old ones. Refused for a CANCELLED job
  and for a run that is in flight.

The job's own state is separate from its runs' states and from the outcome of a command
(the table is in the README, "Job states"). Only job-level events (no ``run_id``) change it:
SCHEDULED, PAUSED, RESUMED (back to SCHEDULED), CANCELLED, and at the end COMPLETED, or DEAD
when the job's last run ended DEAD. A command that cannot be applied (unknown job, a job in
the wrong state, an invalid spec) is a REJECTED event: about the job, never its new state.
Events a command causes directly carry its id (``<command id>:<STATE>``), so whoever sent it
can find the scheduler's verdict.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import orjson

from jobwheel.errors import StateError, ValidationError
from jobwheel.schemas.models import (
    HANDBACK_REASON,
    At,
    CancelJob,
    ConcurrencyPolicy,
    JobCommand,
    PauseJob,
    ReplayRun,
    ResumeJob,
    Run,
    ScheduleJob,
    State,
    StatusEvent,
    TriggerJob,
    spec_document,
)
from jobwheel.schemas.validation import MAX_ID_CHARS, check_command
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
    decode_job,
    encode_job,
    parse_tag,
    peek_timers,
)
from jobwheel.streams.state.partition import PartitionState
from jobwheel.streams.wheel import TimingWheel, WheelEntry

log = logging.getLogger(__name__)

SOURCE = "scheduler"
MAX_MISSED_EVENTS = 100
MAX_HANDBACKS = 10  # a run handed back more often than this is failing, not being handed back
DAY_MS = 24 * 3600 * 1000
MAX_ARGS_BYTES = 64 * 1024
#: Visibility timeouts an attempt may wait for the partition's worker to reach it (see
#: :meth:`SchedulerProcessor.punctuate`) before it is given up anyway.
QUEUE_PATIENCE = 10


def clip_id(text: str) -> str:
    """An id as far as it can go into an event id: a REJECTED event for a 10,000-character
    "job id" must not carry all of it."""
    return text if len(text) <= MAX_ID_CHARS else text[:MAX_ID_CHARS] + "…"


@dataclass(slots=True)
class Output:
    """What one record or punctuation asks the glue to produce, in this order."""

    runs: list[Run] = field(default_factory=list)
    status: list[StatusEvent] = field(default_factory=list)
    dead_runs: list[tuple[Run, str]] = field(default_factory=list)
    #: Why the command was refused as invalid input (the engine dead-letters the record).
    rejected: str | None = None

    def __bool__(self) -> bool:
        return bool(self.runs or self.status or self.dead_runs)

    @property
    def size(self) -> int:
        """How many records this output becomes."""
        return len(self.runs) + len(self.status) + len(self.dead_runs)


class SchedulerProcessor:
    """Decisions for ONE partition. ``fencing_token`` is this owner's epoch for the partition."""

    def __init__(
        self,
        partition: int,
        state: PartitionState,
        fencing_token: int = 0,
        retention_ms: int = DAY_MS,
        max_args_bytes: int = MAX_ARGS_BYTES,
    ) -> None:
        self.partition = partition
        self.state = state
        self.fencing_token = fencing_token
        self.retention_ms = retention_ms
        self.max_args_bytes = max_args_bytes
        self._reached: int | None = None

    # --- state access ---------------------------------------------------------------------

    def load(self, job_id: str) -> JobRecord | None:
        raw = self.state.get(job_id.encode())
        return None if raw is None else decode_job(raw)

    def save(self, job: JobRecord) -> None:
        self.state.put(job.job_id.encode(), encode_job(job))

    # --- events -----------------------------------------------------------------------------

    def _event(
        self,
        job: JobRecord | None,
        job_id: str,
        state: State,
        now_ms: int,
        *,
        event_id: str | None = None,
        run: ActiveRun | None = None,
        seq: int | None = None,
        **fields: object,
    ) -> StatusEvent:
        """A scheduler status event. ``run`` fills in run id, attempt and scheduled time;
        ``fields`` override or add to them (e.g. the run id of a fire that never became a run).
        ``seq`` is the job's next sequence number unless the caller already took one."""
        if seq is None:
            seq = job.next_seq() if job is not None else 0
        if event_id is None:
            event_id = f"{job_id}:{seq}:{state.value}" if job else f"{job_id}:{now_ms}:{state}"
        values: dict[str, object] = (
            {"run_id": run.run_id, "attempt": run.attempt, "scheduled_time_ms": run.scheduled_ms}
            if run
            else {}
        )
        values.update(fields)
        return StatusEvent(
            event_id=event_id,
            job_id=job_id,
            state=state,
            event_time_ms=now_ms,
            source=SOURCE,
            seq=seq,
            task=job.spec.task if job else None,
            # a paused or finished job has no next fire, whatever its record keeps for resume
            next_fire_ms=job.next_fire_ms if job and job.status is JobStatus.ACTIVE else None,
            **values,  # type: ignore[arg-type]
        )

    def reject(self, job_id: str, reason: str, now_ms: int, event_id: str) -> Output:
        """A REJECTED event for a record that could not be applied (the glue dead-letters it)."""
        job = None
        try:
            job = self.load(job_id) if job_id else None
        except StateError:
            job = None
        out = Output()
        out.status.append(
            self._event(job, job_id, State.REJECTED, now_ms, event_id=event_id, reason=reason)
        )
        if job is not None:
            self.save(job)
        return out

    # --- commands ---------------------------------------------------------------------------

    def on_command(self, cmd: JobCommand, now_ms: int) -> Output:
        # The SDK's own rules (one rule set, jobwheel.schemas.validation), judged as of the
        # command's
        # issue time, so a replayed command gets the same verdict. A producer that skips the
        # SDK gets a REJECTED event, and the engine dead-letters the record.
        try:
            check_command(cmd, now_ms=cmd.issued_at_ms, max_args_bytes=self.max_args_bytes)
        except ValidationError as exc:
            reason = f"invalid command: {exc}"
            out = self.reject(
                clip_id(cmd.job_id), reason, now_ms, event_id=f"{clip_id(cmd.command_id)}:REJECTED"
            )
            out.rejected = reason
            return out
        body = cmd.body
        if isinstance(body, ScheduleJob):
            return self._schedule(cmd, body, now_ms)
        if isinstance(body, ReplayRun):
            return self._replay(cmd, body, now_ms)
        job = self.load(cmd.job_id)
        if job is None:
            return self.reject(
                cmd.job_id,
                f"unknown job {cmd.job_id!r}: never scheduled (or finished and forgotten after "
                "the scheduler's retention); no job is created for it",
                now_ms,
                event_id=f"{cmd.command_id}:REJECTED",
            )
        if cmd.command_id in job.recent_commands:
            return Output()  # a redelivered command: already applied
        job.remember(cmd.command_id)
        out = Output()
        if isinstance(body, CancelJob):
            self._cancel(job, cmd, body, now_ms, out)
        elif isinstance(body, PauseJob):
            self._pause(job, cmd, body, now_ms, out)
        elif isinstance(body, ResumeJob):
            self._resume(job, cmd, body, now_ms, out)
        elif isinstance(body, TriggerJob):
            self._trigger(job, cmd, body, now_ms, out)
        self.save(job)
        return out

    def _refuse(
        self, job: JobRecord, cmd: JobCommand, reason: str, now_ms: int, out: Output
    ) -> None:
        """A command that does not apply to the job as it is: an event on the job, which keeps
        its state."""
        out.status.append(
            self._event(
                job,
                job.job_id,
                State.REJECTED,
                now_ms,
                event_id=f"{cmd.command_id}:REJECTED",
                reason=reason,
            )
        )

    def _schedule(self, cmd: JobCommand, spec: ScheduleJob, now_ms: int) -> Output:
        job = self.load(cmd.job_id)
        if job is not None:
            if cmd.command_id in job.recent_commands:
                return Output()
            if spec.idempotency_key is not None and spec.idempotency_key == (
                job.spec.idempotency_key
            ):
                job.remember(cmd.command_id)
                self.save(job)
                return Output()
            job.spec = spec
            job.issued_at_ms = cmd.issued_at_ms
            job.status = JobStatus.ACTIVE
            job.expires_at_ms = None
            job.last_outcome = None
        else:
            job = JobRecord(job_id=cmd.job_id, spec=spec, issued_at_ms=cmd.issued_at_ms)
        job.remember(cmd.command_id)
        job.next_fire_ms = triggers.first_fire_ms(spec.trigger, cmd.issued_at_ms)
        out = Output()
        out.status.append(
            self._event(
                job,
                job.job_id,
                State.SCHEDULED,
                now_ms,
                event_id=f"{cmd.command_id}:SCHEDULED",
                spec_json=orjson.dumps(spec_document(spec)).decode(),
            )
        )
        self.save(job)
        return out

    def _cancel(
        self, job: JobRecord, cmd: JobCommand, body: CancelJob, now_ms: int, out: Output
    ) -> None:
        if job.status is JobStatus.CANCELLED:
            self._refuse(job, cmd, "job is already CANCELLED", now_ms, out)
            return
        if job.status in (JobStatus.COMPLETED, JobStatus.DEAD):
            reason = f"job is {job.status.shown}: it has finished, nothing is left to cancel"
            self._refuse(job, cmd, reason, now_ms, out)
            return
        job.status = JobStatus.CANCELLED
        job.next_fire_ms = None
        self._retire(job, now_ms)
        out.status.append(
            self._event(
                job,
                job.job_id,
                State.CANCELLED,
                now_ms,
                event_id=f"{cmd.command_id}:CANCELLED",
                reason=body.reason,
            )
        )

    def _pause(
        self, job: JobRecord, cmd: JobCommand, body: PauseJob, now_ms: int, out: Output
    ) -> None:
        if job.status is not JobStatus.ACTIVE:
            already = "already " if job.status is JobStatus.PAUSED else ""
            self._refuse(job, cmd, f"cannot pause: job is {already}{job.status.shown}", now_ms, out)
            return
        job.status = JobStatus.PAUSED
        out.status.append(
            self._event(
                job,
                job.job_id,
                State.PAUSED,
                now_ms,
                event_id=f"{cmd.command_id}:PAUSED",
                reason=body.reason,
            )
        )

    def _resume(
        self, job: JobRecord, cmd: JobCommand, body: ResumeJob, now_ms: int, out: Output
    ) -> None:
        if job.status is not JobStatus.PAUSED:
            reason = f"cannot resume: job is {job.status.shown}, not PAUSED"
            self._refuse(job, cmd, reason, now_ms, out)
            return
        job.status = JobStatus.ACTIVE
        out.status.append(
            self._event(
                job,
                job.job_id,
                State.RESUMED,
                now_ms,
                event_id=f"{cmd.command_id}:RESUMED",
                reason=body.reason,
            )
        )
        # Its last fire may have passed and its runs ended while it was paused: then it ends now.
        self._settle(job, now_ms, out)

    def _trigger(
        self, job: JobRecord, cmd: JobCommand, body: TriggerJob, now_ms: int, out: Output
    ) -> None:
        if job.status is JobStatus.CANCELLED:
            self._refuse(job, cmd, "cannot trigger: job is CANCELLED", now_ms, out)
            return
        run_id = f"{job.job_id}@trigger-{cmd.issued_at_ms}"
        if run_id in job.active:
            return
        self._dispatch(job, run_id, cmd.issued_at_ms, 1, now_ms, out, reason=body.reason)

    def _replay(self, cmd: JobCommand, body: ReplayRun, now_ms: int) -> Output:
        out = Output()
        job = self.load(cmd.job_id)
        if job is None:
            # Forgotten after its retention: the dead run's own definition, a finished job.
            spec = ScheduleJob(
                task=body.task,
                trigger=At(body.scheduled_time_ms),
                args_json=body.args_json,
                max_attempts=body.max_attempts,
                timeout_ms=body.timeout_ms,
                visibility_timeout_ms=body.visibility_timeout_ms,
            )
            job = JobRecord(
                job_id=cmd.job_id,
                spec=spec,
                issued_at_ms=cmd.issued_at_ms,
                status=JobStatus.DEAD,
                seq=cmd.issued_at_ms,  # above any seq the forgotten record reached
                last_outcome=State.DEAD.value,
            )
        elif cmd.command_id in job.recent_commands:
            return out  # a redelivered command: already applied
        job.remember(cmd.command_id)
        if job.status is JobStatus.CANCELLED:
            self._refuse(job, cmd, "cannot replay: job is CANCELLED", now_ms, out)
        elif body.run_id in job.active:
            reason = f"cannot replay run {body.run_id}: it is in flight, not DEAD"
            self._refuse(job, cmd, reason, now_ms, out)
        else:
            note = f"replay of DEAD run {body.run_id} (attempt {body.attempt} was its last)"
            self._dispatch(
                job,
                body.run_id,
                body.scheduled_time_ms,
                body.attempt + 1,
                now_ms,
                out,
                reason=f"{note}: {body.reason}" if body.reason else note,
                base=body.attempt,
                event_id=f"{cmd.command_id}:DISPATCHED",
            )
        self.save(job)
        return out

    # --- dispatch ---------------------------------------------------------------------------

    def _make_run(self, job: JobRecord, active: ActiveRun, now_ms: int) -> Run:
        spec = job.spec
        return Run(
            run_id=active.run_id,
            job_id=job.job_id,
            task=spec.task,
            args_json=spec.args_json,
            seq=active.seq,
            scheduled_time_ms=active.scheduled_ms,
            dispatched_at_ms=now_ms,
            attempt=active.attempt,
            max_attempts=spec.max_attempts + active.limit_extra,
            timeout_ms=spec.timeout_ms,
            visibility_timeout_ms=spec.visibility_timeout_ms,
            deadline_ms=active.due_ms,
            partition=self.partition,
            fencing_token=self.fencing_token,
        )

    def _dispatch(
        self,
        job: JobRecord,
        run_id: str,
        scheduled_ms: int,
        attempt: int,
        now_ms: int,
        out: Output,
        reason: str | None = None,
        handbacks: int = 0,
        base: int = 0,
        event_id: str | None = None,
    ) -> None:
        deadline = now_ms + job.spec.visibility_timeout_ms
        seq = job.next_seq()
        active = ActiveRun(
            run_id=run_id,
            scheduled_ms=scheduled_ms,
            attempt=attempt,
            seq=seq,
            phase=RunPhase.DISPATCHED,
            due_ms=deadline,
            handbacks=handbacks,
            base=base,
            dispatched_ms=now_ms,
        )
        job.active[run_id] = active
        out.runs.append(self._make_run(job, active, now_ms))
        out.status.append(
            self._event(
                job,
                job.job_id,
                State.DISPATCHED,
                now_ms,
                event_id=event_id or f"{run_id}:{attempt}:DISPATCHED",
                run=active,
                seq=seq,  # the Run carries it too: worker events sort after this one
                deadline_ms=deadline,
                reason=reason,
            )
        )

    def _finish(self, job: JobRecord, run: ActiveRun, now_ms: int, out: Output) -> None:
        """Forget a run that SUCCEEDED; a job with nothing left to do is COMPLETED."""
        job.active.pop(run.run_id, None)
        job.last_outcome = State.SUCCEEDED.value
        self._settle(job, now_ms, out)

    def _retire(self, job: JobRecord, now_ms: int) -> None:
        """A finished job's record is kept ``retention_ms`` (so late or redelivered commands
        for it are still recognised), then deleted: finished jobs must not cost disk forever."""
        job.expires_at_ms = now_ms + self.retention_ms

    # --- punctuation ------------------------------------------------------------------------

    def punctuate(
        self,
        now_ms: int,
        limit: int,
        deadline_watermark: int | None = None,
        max_records: int | None = None,
        reached_ms: int | None = None,
    ) -> tuple[Output, int]:
        """Handle up to ``limit`` due timers, stopping early once the output reaches
        ``max_records`` records (one transaction stays bounded however far behind the
        partition is); returns the output and how many timers were handled. What is left is
        still due at the next call.

        Fires, retries and expiries are due at ``now_ms``; visibility deadlines only up to
        ``deadline_watermark`` (how far the acknowledgements have been read; ``now_ms`` when
        None), so no attempt is given up while its verdict may be waiting unread.
        ``reached_ms`` is how far the partition's worker has got (the latest dispatch time of
        a run it has reported on; None: unknown): an attempt dispatched after that is still
        queued behind other runs, not lost, and gets another visibility timeout instead of a
        second copy (for at most :data:`QUEUE_PATIENCE` timeouts).
        """
        self._reached = reached_ms
        out = Output()
        budget = max_records if max_records is not None else 1 << 62
        entries = self.state.timers.due(now_ms, limit)
        handled = self._handle_due(self.state.timers, TIMERS, entries, now_ms, out, budget)
        if handled < limit and out.size < budget:
            watermark = now_ms if deadline_watermark is None else min(now_ms, deadline_watermark)
            entries = self.state.deadlines.due(watermark, limit - handled)
            handled += self._handle_due(
                self.state.deadlines, DEADLINES, entries, now_ms, out, budget
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
    ) -> int:
        handled = 0
        for entry in entries:
            if out.size >= budget:
                break
            handled += 1
            try:
                self._on_due(entry, now_ms, out)
            except StateError:
                log.exception(
                    "dropping a timer whose job state is unreadable",
                    extra={"job_id": entry.job_id, "partition": self.partition},
                )
            # Handling a timer changes the record that derives it. One that is still derived
            # (a record that could not be read, or did not move) is dropped from the index, so
            # that it cannot come back on every punctuation; so is an entry without a record.
            raw = self.state.get(entry.job_id.encode())
            if raw is None or (kind, entry.due_ms, entry.tag.encode()) in peek_timers(raw):
                if raw is not None:
                    log.error(
                        "timer handled but still pending; dropped",
                        extra={"job_id": entry.job_id, "tag": entry.tag, "due_ms": entry.due_ms},
                    )
                wheel.remove(entry)
        return handled

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
            out.status.append(
                self._event(
                    job,
                    job.job_id,
                    State.SKIPPED,
                    now_ms,
                    event_id=f"{job.job_id}@{latest}:SKIPPED",
                    run_id=f"{job.job_id}@{latest}",
                    scheduled_time_ms=latest,
                    reason=f"run {running[0].run_id} still active (concurrencyPolicy=FORBID)",
                )
            )
            self._settle(job, now_ms, out)
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
        return self._event(
            job,
            job.job_id,
            State.MISSED,
            now_ms,
            event_id=f"{job.job_id}@{scheduled_ms}:MISSED",
            run_id=f"{job.job_id}@{scheduled_ms}",
            scheduled_time_ms=scheduled_ms,
            reason=reason,
        )

    def _settle(self, job: JobRecord, now_ms: int, out: Output) -> None:
        """A job with no fire ahead and no run in flight has finished: DEAD if the last of its
        runs to end ended DEAD, else COMPLETED. A finished job that a manual trigger ran again
        is settled again by that run's outcome. Paused and cancelled jobs stay as they are
        (a paused one is settled when it is resumed)."""
        if job.active or job.status in (JobStatus.PAUSED, JobStatus.CANCELLED):
            return
        if job.status is JobStatus.ACTIVE and job.next_fire_ms is not None:
            return
        end = JobStatus.DEAD if job.last_outcome == State.DEAD.value else JobStatus.COMPLETED
        if job.status is end:
            return
        job.status = end
        self._retire(job, now_ms)
        reason = None
        if end is JobStatus.DEAD:
            reason = f"its last run ended DEAD: {job.last_error}" if job.last_error else None
        out.status.append(self._event(job, job.job_id, State(end.value), now_ms, reason=reason))

    def _on_visibility_deadline(
        self, job: JobRecord, run: ActiveRun, now_ms: int, out: Output
    ) -> None:
        if job.status is JobStatus.CANCELLED:
            self._give_up(job, run, now_ms, out, State.SKIPPED, "job cancelled")
            return
        timeout = job.spec.visibility_timeout_ms
        if (
            self._reached is not None
            and run.dispatched_ms > self._reached
            and now_ms - run.dispatched_ms < QUEUE_PATIENCE * timeout
        ):
            # Not yet reached by the partition's worker (it starts runs in dispatch order):
            # waiting behind a backlog, not lost. A copy would only join the same queue.
            run.due_ms = now_ms + timeout
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

    def _redispatch(
        self,
        job: JobRecord,
        run: ActiveRun,
        attempt: int,
        now_ms: int,
        out: Output,
        reason: str,
        handback: bool = False,
    ) -> None:
        if job.status is JobStatus.CANCELLED:
            self._give_up(job, run, now_ms, out, State.SKIPPED, "job cancelled")
            return
        job.active.pop(run.run_id, None)
        self._dispatch(
            job,
            run.run_id,
            run.scheduled_ms,
            attempt,
            now_ms,
            out,
            reason=reason,
            handbacks=run.handbacks + int(handback),
            base=run.base,
        )

    def _give_up(
        self, job: JobRecord, run: ActiveRun, now_ms: int, out: Output, state: State, reason: str
    ) -> None:
        job.active.pop(run.run_id, None)
        job.last_outcome = state.value
        if state is State.DEAD:
            job.last_error = reason
            out.dead_runs.append((self._make_run(job, run, now_ms), reason))
        out.status.append(
            self._event(
                job,
                job.job_id,
                state,
                now_ms,
                run=run,
                event_id=f"{run.run_id}:{run.attempt}:{state.value}",
                reason=reason,
            )
        )
        self._settle(job, now_ms, out)

    # --- acknowledgements from workers ------------------------------------------------------

    def on_ack(self, ev: StatusEvent, now_ms: int, ack_time_ms: int | None = None) -> Output:
        """A worker's event about a run. ``ack_time_ms`` is when it was appended to the acks
        topic (broker time; ``now_ms`` when unknown): a heartbeat extends the deadline from
        then, on the scheduler's side of the clock, not by what the worker claims."""
        out = Output()
        if ev.run_id is None:
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
            if extended > run.due_ms:
                run.due_ms = extended
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
        job.last_error = ev.error
        retryable = ev.retry_delay_ms is not None and job.status is not JobStatus.CANCELLED
        if retryable and run.attempt < job.spec.max_attempts + run.limit_extra:
            delay = max(0, ev.retry_delay_ms or 0)
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
        if job.status is JobStatus.CANCELLED:
            reason = "job cancelled"
        elif ev.retry_delay_ms is None:
            reason = f"attempt {run.attempt} failed and is not retryable: {ev.error}"
        else:
            reason = (
                f"attempt {run.attempt} of {job.spec.max_attempts + run.base} failed: {ev.error}"
            )
        self._give_up(job, run, now_ms, out, State.DEAD, reason)


__all__ = ["Output", "SchedulerProcessor"]
