"""The rules of the commands on the requests topic: schedule, cancel, pause, resume, trigger
and replay, each turned into status events and runs (or a REJECTED event)."""

from __future__ import annotations

from jobwheel.errors import RecordTooLargeError, ValidationError
from jobwheel.schemas.models import (
    At,
    CancelJob,
    JobCommand,
    PauseJob,
    ReplayRun,
    ResumeJob,
    ScheduleJob,
    State,
    TriggerJob,
    trigger_run_id,
)
from jobwheel.schemas.validation import check_command
from jobwheel.streams import triggers
from jobwheel.streams.jobstate import (
    JobRecord,
    JobStatus,
    spec_json,
)
from jobwheel.streams.rules.core import (
    TOO_LARGE,
    Output,
    ProcessorCore,
    clip_id,
)


class CommandRules(ProcessorCore):
    def on_command(self, cmd: JobCommand, now_ms: int) -> Output:
        """The command's events and runs; a command whose change would make the job's record
        too large for its changelog is REJECTED whole (nothing of it is kept) with the size
        in its reason, and the engine dead-letters it."""
        try:
            return self._command(cmd, now_ms)
        except RecordTooLargeError as exc:
            reason = f"refused: {exc}"
            out = self.reject(
                clip_id(cmd.job_id), reason, now_ms, event_id=f"{clip_id(cmd.command_id)}:REJECTED"
            )
            out.rejected = reason
            out.problems.append(TOO_LARGE)
            return out

    def _command(self, cmd: JobCommand, now_ms: int) -> Output:
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
        if isinstance(body, ScheduleJob | ReplayRun) and (
            unknown := self.unknown_queue(body.queue)
        ):
            # Refused before anything changes, and dead-lettered by the engine: declared
            # later, the queue takes the command replayed from there. Never accepted into a
            # job whose runs no topic could carry.
            if isinstance(body, ScheduleJob) or self.load(cmd.job_id) is None:
                out = self.reject(
                    clip_id(cmd.job_id),
                    unknown,
                    now_ms,
                    event_id=f"{clip_id(cmd.command_id)}:REJECTED",
                )
                out.rejected = unknown
                return out
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
                spec_json=spec_json(job),
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
        self._answer(job, cmd, State.CANCELLED, now_ms, out, body.reason)

    def _pause(
        self, job: JobRecord, cmd: JobCommand, body: PauseJob, now_ms: int, out: Output
    ) -> None:
        if job.status is not JobStatus.ACTIVE:
            already = "already " if job.status is JobStatus.PAUSED else ""
            self._refuse(job, cmd, f"cannot pause: job is {already}{job.status.shown}", now_ms, out)
            return
        job.status = JobStatus.PAUSED
        self._answer(job, cmd, State.PAUSED, now_ms, out, body.reason)

    def _resume(
        self, job: JobRecord, cmd: JobCommand, body: ResumeJob, now_ms: int, out: Output
    ) -> None:
        if job.status is not JobStatus.PAUSED:
            reason = f"cannot resume: job is {job.status.shown}, not PAUSED"
            self._refuse(job, cmd, reason, now_ms, out)
            return
        job.status = JobStatus.ACTIVE
        self._answer(job, cmd, State.RESUMED, now_ms, out, body.reason)
        # Its last fire may have passed and its runs ended while it was paused: then it ends now.
        self._settle(job, now_ms, out)

    def _trigger(
        self, job: JobRecord, cmd: JobCommand, body: TriggerJob, now_ms: int, out: Output
    ) -> None:
        if job.status is JobStatus.CANCELLED:
            self._refuse(job, cmd, "cannot trigger: job is CANCELLED", now_ms, out)
            return
        # The run is named by the trigger's issue time: the name the API and the CLI give
        # whoever sent it. Two triggers issued in the same millisecond would share it, and
        # the second run's events (same event ids) would merge with the first's in the status
        # store. So the second is refused, visibly, rather than run under a taken name.
        issued = cmd.issued_at_ms
        run_id = trigger_run_id(job.job_id, issued)
        if run_id in job.active:
            taken = "is running"
        elif issued in job.recent_triggers:
            taken = "has run"
        elif job.trigger_floor is not None and issued <= job.trigger_floor:
            taken = "may have run (it is no later than a trigger the job no longer remembers)"
        else:
            taken = None
        if taken is not None:
            reason = (
                f"cannot trigger: run {clip_id(run_id)!r} of a trigger issued at the same "
                f"instant ({issued} ms) {taken}; a trigger's run is named by its issue time "
                "and one name cannot stand for two runs: trigger again"
            )
            self._refuse(job, cmd, reason, now_ms, out)
            return
        crowded = self._crowded(job)
        if crowded is not None:
            self._refuse(job, cmd, f"cannot trigger: {crowded}", now_ms, out)
            return
        job.remember_trigger(issued)
        self._dispatch(job, run_id, issued, 1, now_ms, out, reason=body.reason)

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
                queue=body.queue,
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
        elif (taken := self._replayed(job, body)) is not None:
            reason = (
                f"cannot replay run {body.run_id} from its attempt {body.attempt}: {taken}; "
                "one run id and attempt cannot stand for two executions: replay the run's "
                "latest dead letter, or trigger the job"
            )
            self._refuse(job, cmd, reason, now_ms, out)
        elif (crowded := self._crowded(job)) is not None:
            self._refuse(job, cmd, f"cannot replay run {body.run_id}: {crowded}", now_ms, out)
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
            job.remember_replay(body.run_id, body.scheduled_time_ms, body.attempt + 1)
        self.save(job)
        return out

    @staticmethod
    def _replayed(job: JobRecord, body: ReplayRun) -> str | None:
        """Why a replay of this dead letter would dispatch an attempt of the run that a
        replay has already dispatched (None: it would not). Replays of one run go up: each
        starts past the attempt its dead letter names, and a run that dies again leaves a
        letter with a later attempt; so a letter whose next attempt is not past the latest
        replay's is one replayed already (its run may have ended since, in any way)."""
        seen = job.replays.get(body.run_id)
        if seen is not None:
            if body.attempt + 1 <= seen[1]:
                return f"a replay has dispatched its attempt {seen[1]} already"
            return None
        if job.replay_floor is not None and body.scheduled_time_ms <= job.replay_floor:
            return (
                "it may have been replayed already (it is scheduled no later than a replayed "
                "run the job no longer remembers)"
            )
        return None

    def _answer(
        self,
        job: JobRecord,
        cmd: JobCommand,
        state: State,
        now_ms: int,
        out: Output,
        reason: str | None,
    ) -> None:
        """The job-level event a command causes directly, under the command's id
        (``<command id>:<STATE>``), so whoever sent it can find the scheduler's verdict."""
        out.status.append(
            self._event(
                job,
                job.job_id,
                state,
                now_ms,
                event_id=f"{cmd.command_id}:{state.value}",
                reason=reason,
            )
        )
