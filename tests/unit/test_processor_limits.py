"""What the processor does with a change it cannot keep: a job record its changelog could not
carry (a bound on the runs in flight, the size checked before the write) and a timer whose
handling fails (a zone this host lacks, the trigger arithmetic, an output the codec refuses).
Each is refused or undone whole, with its event, and the partition goes on."""

from __future__ import annotations

import itertools

import pytest

from jobwheel.errors import ValidationError
from jobwheel.schemas.models import (
    ConcurrencyPolicy,
    Cron,
    Every,
    JobCommand,
    Now,
    ScheduleJob,
    State,
    StatusEvent,
    TriggerJob,
)
from jobwheel.streams import triggers
from jobwheel.streams.jobstate import JobRecord, JobStatus
from jobwheel.streams.processor import TIMER_FAILED, TOO_LARGE, Output, SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState

T0 = 1_800_000_000_000
_ids = itertools.count()


def cmd(job_id: str, body, at: int = T0) -> JobCommand:
    return JobCommand(command_id=f"c{next(_ids)}", job_id=job_id, issued_at_ms=at, body=body)


def states(out) -> list[State]:
    return [e.state for e in out.status]


def every(policy=ConcurrencyPolicy.ALLOW, **kw) -> ScheduleJob:
    return ScheduleJob(
        task="demo.echo",
        trigger=Every(1000),
        concurrency_policy=policy,
        visibility_timeout_ms=3_600_000,
        **kw,
    )


def test_an_allow_job_never_has_more_runs_in_flight_than_the_bound():
    """An ``every 1s`` ALLOW job whose runs get no verdict (no worker) gathered 6,000 runs in
    flight, a 1.08 MB record. Past the bound a fire is SKIPPED saying why, and a trigger is
    REJECTED; once a run ends, the next fire runs again."""
    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()), max_active_runs=3)
    proc.on_command(cmd("j", every()), T0)
    runs = []
    for i in range(1, 4):
        runs += proc.punctuate(T0 + i * 1000, 10)[0].runs
    assert len(runs) == 3 and len(proc.load("j").active) == 3
    out, _ = proc.punctuate(T0 + 4000, 10)
    assert out.runs == [] and states(out) == [State.SKIPPED]
    skipped = out.status[0]
    assert skipped.run_id == f"j@{T0 + 4000}" and skipped.scheduled_time_ms == T0 + 4000
    assert "3 runs of the job are in flight" in skipped.reason
    assert "JOBWHEEL_SCHEDULER_MAX_ACTIVE_RUNS" in skipped.reason
    job = proc.load("j")
    assert len(job.active) == 3 and job.next_fire_ms == T0 + 5000  # the schedule goes on
    proc.save(job)
    out = proc.on_command(cmd("j", TriggerJob(), at=T0 + 4100), T0 + 4100)
    assert out.runs == [] and states(out) == [State.REJECTED]
    assert "cannot trigger: 3 runs" in out.status[0].reason

    verdict = StatusEvent(
        event_id="v",
        job_id="j",
        state=State.SUCCEEDED,
        event_time_ms=T0 + 4200,
        source="worker",
        run_id=runs[0].run_id,
        seq=runs[0].seq,
        attempt=1,
    )
    proc.on_ack(verdict, T0 + 4200)
    [run] = proc.punctuate(T0 + 5000, 10)[0].runs
    assert run.run_id == f"j@{T0 + 5000}"


def test_forbid_and_replace_are_not_changed_by_the_bound():
    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()), max_active_runs=1)
    proc.on_command(cmd("f", every(ConcurrencyPolicy.FORBID)), T0)
    proc.on_command(cmd("r", every(ConcurrencyPolicy.REPLACE)), T0)
    proc.punctuate(T0 + 1000, 10)
    out, _ = proc.punctuate(T0 + 2000, 10)
    assert sorted((e.job_id, e.state) for e in out.status) == [
        ("f", State.SKIPPED),
        ("r", State.CANCELLED),
        ("r", State.DISPATCHED),
    ]
    assert "concurrencyPolicy=FORBID" in next(e for e in out.status if e.job_id == "f").reason


def test_a_command_that_would_make_a_record_too_large_is_rejected_whole():
    """Checked before the write: nothing of the command is kept (no record, no SCHEDULED),
    the REJECTED event names the size, the engine dead-letters the command."""
    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()), max_record_bytes=8_000)
    big = ScheduleJob(task="demo.echo", trigger=Now(), args_json='{"x": "' + "a" * 9_000 + '"}')
    c = cmd("big", big)
    out = proc.on_command(c, T0)
    assert out.runs == [] and states(out) == [State.REJECTED]
    assert out.status[0].event_id == f"{c.command_id}:REJECTED"
    assert "over the 8000 its changelog can carry" in out.status[0].reason
    assert out.rejected == out.status[0].reason and out.problems == [TOO_LARGE]
    assert proc.load("big") is None and proc.state.changes() == {}
    assert proc.punctuate(T0 + 10, 10)[0].runs == []
    # an existing job keeps its old record when a new spec would not fit
    proc.on_command(cmd("small", ScheduleJob(task="demo.echo", trigger=Every(60_000))), T0)
    before = proc.state.get(b"small")
    out = proc.on_command(cmd("small", big), T0 + 1)
    assert states(out) == [State.REJECTED] and out.problems == [TOO_LARGE]
    assert proc.load("small").spec.trigger == Every(60_000)
    assert proc.state.get(b"small")[:20] == before[:20]


def test_a_fire_that_would_make_a_record_too_large_is_undone_and_pauses_the_job():
    """No bound on runs, a small record limit: the fire that would push the record past it
    is not half-applied (no run out, no run in the record); the job is PAUSED naming the
    size, and another job on the partition fires in the same punctuation."""
    state = PartitionState(MemoryBackend())
    proc = SchedulerProcessor(0, state, max_active_runs=10**6, max_record_bytes=2_000)
    proc.on_command(cmd("grows", every()), T0)
    proc.on_command(cmd("other", ScheduleJob(task="demo.echo", trigger=Every(60_000))), T0)
    t, runs = T0, 0
    while True:
        t += 1000
        out, _ = proc.punctuate(t, 10)
        if State.PAUSED in states(out):
            break
        runs += len(out.runs)
        assert runs < 100
    job = proc.load("grows")
    assert job.status is JobStatus.PAUSED and len(job.active) == runs
    [paused] = [e for e in out.status if e.state is State.PAUSED]
    assert "RecordTooLargeError" in paused.reason and "over the 2000" in paused.reason
    assert [r.job_id for r in out.runs if r.job_id == "grows"] == []
    assert out.problems == [TIMER_FAILED]
    out, _ = proc.punctuate(T0 + 60_000, 10)
    assert [r.job_id for r in out.runs] == ["other"]


def _poisoned_cron(state: PartitionState, job_id: str, due: int) -> None:
    """A job record as a scheduler with newer tzdata accepted it: its zone is unknown here
    (written straight into the state, as a restore from the changelog does)."""
    spec = ScheduleJob(task="demo.echo", trigger=Cron("* * * * *", "Mars/Olympus_Mons"))
    state.save_record(job_id.encode(), JobRecord(job_id, spec, T0, next_fire_ms=due))


def test_a_timer_in_a_zone_this_host_lacks_pauses_its_job_and_the_partition_goes_on():
    state = PartitionState(MemoryBackend())
    proc = SchedulerProcessor(0, state)
    proc.on_command(cmd("fine", ScheduleJob(task="demo.echo", trigger=Now())), T0)
    _poisoned_cron(state, "mars", T0)
    with pytest.raises(ValidationError):  # what the fire runs into
        triggers.next_fire_ms(Cron("* * * * *", "Mars/Olympus_Mons"), T0)
    out, handled = proc.punctuate(T0 + 5, 10)
    assert handled == 2
    assert [r.job_id for r in out.runs] == ["fine"]
    [paused] = [e for e in out.status if e.job_id == "mars"]
    assert paused.state is State.PAUSED and paused.next_fire_ms is None
    assert "ValidationError" in paused.reason and "Mars/Olympus_Mons" in paused.reason
    assert proc.load("mars").status is JobStatus.PAUSED
    later, _ = proc.punctuate(T0 + 120_000, 10)
    assert [e for e in later.status if e.job_id == "mars"] == []  # not again and again


def test_a_value_error_of_the_trigger_arithmetic_pauses_only_its_job(monkeypatch):
    state = PartitionState(MemoryBackend())
    proc = SchedulerProcessor(0, state)
    for job in ("a", "b"):
        proc.on_command(cmd(job, ScheduleJob(task="demo.echo", trigger=Every(1000))), T0)
    real = triggers.next_fire_ms

    def broken(trigger, after_ms):
        if after_ms == T0 + 1000 and broken.calls == 0:
            broken.calls += 1
            raise ValueError("year 10000 is out of range")
        return real(trigger, after_ms)

    broken.calls = 0
    monkeypatch.setattr(triggers, "next_fire_ms", broken)
    out, _ = proc.punctuate(T0 + 1000, 10)
    assert len(out.runs) == 1 and len(states(out)) == 2
    paused = next(e for e in out.status if e.state is State.PAUSED)
    assert "ValueError: year 10000 is out of range" in paused.reason


def test_an_output_the_codec_refuses_undoes_its_timer_and_ends_the_run():
    """``emit`` is where the engine encodes a timer's output: when it raises, nothing of that
    timer stays (neither the record's change nor its records), the job gets its verdict, and
    the other timers' outputs go on."""
    state = PartitionState(MemoryBackend())
    proc = SchedulerProcessor(0, state)
    for job in ("bad", "good"):
        proc.on_command(cmd(job, ScheduleJob(task="demo.echo", trigger=Now())), T0)
    emitted: list[Output] = []

    def emit(part: Output) -> None:
        if any(r.job_id == "bad" for r in part.runs):
            raise ValidationError("run", "cannot encode it")
        emitted.append(part)

    out, handled = proc.punctuate(T0, 10, emit=emit)
    assert handled == 2
    assert [r.job_id for part in emitted for r in part.runs] == ["good"]
    assert out.runs == [r for part in emitted for r in part.runs]
    [paused] = [e for part in emitted for e in part.status if e.job_id == "bad"]
    assert paused.state is State.PAUSED and "cannot encode it" in paused.reason
    bad = proc.load("bad")
    assert bad.status is JobStatus.PAUSED and bad.active == {}
    proc.save(bad)

    # a run's timer: the run ends DEAD with the error (its copy on the dead letters)
    good = proc.load("good")
    [run] = good.active.values()
    proc.save(good)

    def refuse_good(part: Output) -> None:
        if any(r.job_id == "good" for r in part.runs):
            raise ValidationError("run", "cannot encode the retry")

    out, _ = proc.punctuate(run.due_ms, 10, emit=refuse_good)
    assert out.runs == [] and [e.state for e in out.status] == [State.DEAD, State.DEAD]
    assert "cannot encode the retry" in out.status[0].reason
    assert [r.run_id for r, _ in out.dead_runs] == [run.run_id]
    assert proc.load("good").status is JobStatus.DEAD


def test_a_timer_whose_verdict_fails_too_is_dropped_and_the_partition_goes_on():
    state = PartitionState(MemoryBackend())
    proc = SchedulerProcessor(0, state)
    proc.on_command(cmd("fine", ScheduleJob(task="demo.echo", trigger=Now())), T0)
    _poisoned_cron(state, "mars", T0)

    def emit(part: Output) -> None:
        if any(e.job_id == "mars" for e in part.status):
            raise ValidationError("status", "cannot encode")

    out, handled = proc.punctuate(T0 + 5, 10, emit=emit)
    assert handled == 2 and [r.job_id for r in out.runs] == ["fine"]
    assert out.problems == [TIMER_FAILED]
    assert proc.load("mars").status is JobStatus.ACTIVE  # unchanged: its change undone
    assert proc.punctuate(T0 + 6, 10)[1] == 0  # the timer is out of the index
