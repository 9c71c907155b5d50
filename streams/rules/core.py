"""What every rule of the scheduler's processor shares: the output of one record or
punctuation, the job records of the partition, the events, and a run's life (made,
dispatched, redispatched, finished, given up). The rules are mixed in by
:class:`jobwheel.streams.processor.SchedulerProcessor` from :mod:`.commands`, :mod:`.punctuation`
and :mod:`.acks`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from jobwheel.errors import RecordTooLargeError, StateError, ValidationError
from jobwheel.schemas.models import (
    DEFAULT_QUEUE,
    Run,
    State,
    StatusEvent,
)
from jobwheel.schemas.validation import MAX_ID_CHARS
from jobwheel.settings import Settings
from jobwheel.streams.jobstate import (
    ActiveRun,
    JobRecord,
    JobStatus,
    RunPhase,
)
from jobwheel.streams.state.partition import PartitionState

# The processor logs under its public name whichever rule speaks (operators filter on it).
log = logging.getLogger("jobwheel.streams.processor")

SOURCE = "scheduler"
MAX_MISSED_EVENTS = 100
MAX_HANDBACKS = 10  # a run handed back more often than this is failing, not being handed back
DAY_MS = 24 * 3600 * 1000
MAX_ARGS_BYTES = 64 * 1024
#: Visibility timeouts an attempt may wait for the partition's worker to reach it (see
#: :meth:`SchedulerProcessor.punctuate`) before it is given up anyway.
QUEUE_PATIENCE = 10
#: Runs of one job in flight at once, and the largest job record in bytes (key and value):
#: the defaults of ``JOBWHEEL_SCHEDULER_MAX_ACTIVE_RUNS`` and ``..._MAX_RECORD_BYTES``. Each
#: run in flight is an entry of the job's record, which goes to the changelog on every
#: change: an ``every 1s`` ALLOW job with no worker reached 6,000 of them, a 1.08 MB record.
MAX_ACTIVE_RUNS: int = Settings.model_fields["scheduler_max_active_runs"].default
MAX_RECORD_BYTES: int = Settings.model_fields["scheduler_max_record_bytes"].default
#: A worker's error text kept in a job record (the record is written on every change).
MAX_ERROR_CHARS = 2000
#: :attr:`Output.problems`: a change refused because the job's record would be too large.
TOO_LARGE = "record-too-large"
#: :attr:`Output.problems`: a timer whose handling failed (the job paused or its run ended).
TIMER_FAILED = "timer-failed"


def clip_id(text: str) -> str:
    """An id as far as it can go into an event id: a REJECTED event for a 10,000-character
    "job id" must not carry all of it."""
    return text if len(text) <= MAX_ID_CHARS else text[:MAX_ID_CHARS] + "…"


def cut(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """A text as far as a job record keeps it."""
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass(slots=True)
class Output:
    """What one record or punctuation asks the glue to produce, in this order."""

    runs: list[Run] = field(default_factory=list)
    status: list[StatusEvent] = field(default_factory=list)
    dead_runs: list[tuple[Run, str]] = field(default_factory=list)
    #: Why the command or ack was refused as invalid input (the engine dead-letters the
    #: record).
    rejected: str | None = None
    #: Changes the processor refused or undid (:data:`TOO_LARGE`, :data:`TIMER_FAILED`), for
    #: the metrics: each also has its event.
    problems: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.runs or self.status or self.dead_runs or self.problems)

    @property
    def size(self) -> int:
        """How many records this output becomes."""
        return len(self.runs) + len(self.status) + len(self.dead_runs)

    def mark(self) -> tuple[int, int, int, int]:
        """Where the output is now, for :meth:`since` and :meth:`truncate`."""
        return len(self.runs), len(self.status), len(self.dead_runs), len(self.problems)

    def since(self, mark: tuple[int, int, int, int]) -> Output:
        """What was added after ``mark``."""
        runs, status, dead, problems = mark
        return Output(
            self.runs[runs:],
            self.status[status:],
            self.dead_runs[dead:],
            problems=self.problems[problems:],
        )

    def truncate(self, mark: tuple[int, int, int, int]) -> None:
        """Forget what was added after ``mark``."""
        runs, status, dead, problems = mark
        del self.runs[runs:], self.status[status:], self.dead_runs[dead:]
        del self.problems[problems:]


class ProcessorCore:
    """Decisions for ONE partition. ``fencing_token`` is this owner's epoch for the partition."""

    def __init__(
        self,
        partition: int,
        state: PartitionState,
        fencing_token: int = 0,
        retention_ms: int = DAY_MS,
        max_args_bytes: int = MAX_ARGS_BYTES,
        max_active_runs: int = MAX_ACTIVE_RUNS,
        max_record_bytes: int = MAX_RECORD_BYTES,
        queues: Collection[str] = (DEFAULT_QUEUE,),
    ) -> None:
        self.partition = partition
        #: The queues (``JOBWHEEL_QUEUES`` and, through the engine's
        #: :class:`~jobwheel.kafka.queues.QueueDirectory`, those added at run time): a job
        #: naming another is REJECTED, and a run is never produced to a topic not seen. Kept
        #: as given, not copied: the engine's directory learns new queues while this runs.
        self.queues = queues
        self.state = state
        self.fencing_token = fencing_token
        self.retention_ms = retention_ms
        self.max_args_bytes = max_args_bytes
        self.max_active_runs = max_active_runs
        #: The engine lowers it when its producer refuses a smaller changelog record.
        self.max_record_bytes = max_record_bytes
        self._reached: int | None = None
        #: Per queue, during a punctuation: how far the queue's workers have got, and up to
        #: where the queue's own acks allow deadlines to expire (see ``punctuate``).
        self._reached_by_queue: Mapping[str, int] | None = None
        self._queue_watermark: Callable[[str], int] | None = None
        self._queue_acked: Mapping[str, int] | None = None

    def load(self, job_id: str) -> JobRecord | None:
        """The job's record, the caller's to change and :meth:`save`."""
        return self.state.load_record(job_id.encode())

    def save(self, job: JobRecord) -> None:
        """Write the record, or :class:`~jobwheel.errors.RecordTooLargeError` and nothing
        written (the caller's change is refused whole)."""
        self.state.save_record(job.job_id.encode(), job, self.max_record_bytes)

    def _crowded(self, job: JobRecord) -> str | None:
        """Why the job may not have another run in flight now (None: it may)."""
        if len(job.active) < self.max_active_runs:
            return None
        return (
            f"{len(job.active)} runs of the job are in flight, the most one job may have "
            "(JOBWHEEL_SCHEDULER_MAX_ACTIVE_RUNS): none has had its verdict; are the workers "
            "running?"
        )

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
            queue=job.spec.queue if job else None,
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
            try:
                self.save(job)
            except RecordTooLargeError:
                pass  # the event stands; its sequence number is not kept
        return out

    def unknown_queue(self, queue: str) -> str | None:
        """Why ``queue`` cannot take runs here (None: it can): the reason a job naming it is
        REJECTED, naming the queue and how to declare it."""
        if queue == DEFAULT_QUEUE or queue in self.queues:
            return None
        return (
            f"unknown queue {queue!r}: this scheduler's queues are "
            f"{', '.join(sorted({DEFAULT_QUEUE, *self.queues}))}; add it (`jobwheel queues add "
            f"{queue}` creates its runs topic; or JOBWHEEL_QUEUES={queue} on the schedulers and "
            "`jobwheel topics ensure`), start workers for it (`jobwheel worker --queue "
            f"{queue}`), then send the command again (`jobwheel dlq replay` resends it)"
        )

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
            queue=spec.queue,
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
        unknown = self.unknown_queue(job.spec.queue)
        if unknown is not None:
            # A job accepted while its queue was declared, on a scheduler started since
            # without it: no runs topic to put the run on. The caller's guard gives the job
            # its verdict (a fire pauses the job, a run ends DEAD), naming the queue.
            raise ValidationError("queue", unknown)
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
            job.last_error = cut(reason)
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
