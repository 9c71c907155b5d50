"""The scheduler's dead-letter replay rule (``ReplayRun``), record by record with time passed in.

A replay dispatches a DEAD run again as the same run (same run id and scheduled time, the next
attempt, a fresh allowance of attempts), says so in its DISPATCHED event, and settles the job by
the replayed run's outcome, also when the scheduler has forgotten the job since.
"""

from __future__ import annotations

import itertools

import pytest

from jobwheel.errors import ValidationError
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import (
    CancelJob,
    JobCommand,
    Now,
    ReplayRun,
    Run,
    ScheduleJob,
    State,
    StatusEvent,
)
from jobwheel.schemas.validation import check_command
from jobwheel.streams.jobstate import decode_job, encode_job
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState

T0 = 1_800_000_000_000
_ids = itertools.count()


def cmd(job_id: str, body, at: int = T0) -> JobCommand:
    return JobCommand(command_id=f"c{next(_ids)}", job_id=job_id, issued_at_ms=at, body=body)


def ack(run: Run, state: State, at: int, **kw) -> StatusEvent:
    return StatusEvent(
        event_id=f"{run.run_id}:{run.attempt}:{state}:{at}",
        job_id=run.job_id,
        state=state,
        event_time_ms=at,
        source="worker",
        run_id=run.run_id,
        seq=run.seq,
        attempt=run.attempt,
        **kw,
    )


def replay_of(run: Run, reason: str | None = None) -> ReplayRun:
    """The command `jobwheel dlq replay` builds from a dead-letter record."""
    return ReplayRun(
        run_id=run.run_id,
        scheduled_time_ms=run.scheduled_time_ms,
        attempt=run.attempt,
        task=run.task,
        args_json=run.args_json,
        max_attempts=run.max_attempts,
        timeout_ms=run.timeout_ms,
        visibility_timeout_ms=run.visibility_timeout_ms,
        reason=reason,
    )


def dead_run(proc: SchedulerProcessor, job_id: str = "j", max_attempts: int = 2) -> Run:
    """A one-off job whose run failed ``max_attempts`` times and ended DEAD."""
    spec = ScheduleJob(task="demo.flaky", trigger=Now(), args_json='{"n": 1}')
    proc.on_command(cmd(job_id, ScheduleJob(**{**_fields(spec), "max_attempts": max_attempts})), T0)
    [run] = proc.punctuate(T0, 10)[0].runs
    t = T0
    while True:
        t += 10
        out = proc.on_ack(ack(run, State.FAILED, t, error="E: broken", retry_delay_ms=0), t)
        if out.dead_runs:
            [(dead, _reason)] = out.dead_runs
            assert proc.load(job_id).status.shown == "DEAD"
            return dead
        [run] = proc.punctuate(t, 10)[0].runs


def _fields(spec: ScheduleJob) -> dict:
    return {name: getattr(spec, name) for name in spec.__slots__}


@pytest.fixture
def proc() -> SchedulerProcessor:
    return SchedulerProcessor(1, PartitionState(MemoryBackend()), 4)


def test_a_replayed_dead_run_is_the_same_run_at_its_next_attempt_and_says_so(proc):
    dead = dead_run(proc)
    c = cmd("j", replay_of(dead, "task fixed in 1.2.3"), at=T0 + 1000)
    out = proc.on_command(c, T0 + 1000)
    [run] = out.runs
    assert (run.run_id, run.scheduled_time_ms, run.attempt) == (
        dead.run_id,
        dead.scheduled_time_ms,
        3,
    )
    assert run.max_attempts == 2 + 2  # its own two attempts after the two it used
    assert (run.task, run.args_json) == ("demo.flaky", '{"n": 1}')
    [event] = out.status
    assert (event.state, event.event_id, event.run_id) == (
        State.DISPATCHED,
        f"{c.command_id}:DISPATCHED",
        dead.run_id,
    )
    assert "replay of DEAD run" in event.reason and "task fixed in 1.2.3" in event.reason
    assert proc.load("j").status.shown == "DEAD"  # nothing changes until the run ends


def test_a_replayed_run_that_succeeds_completes_the_dead_job(proc):
    dead = dead_run(proc)
    [run] = proc.on_command(cmd("j", replay_of(dead)), T0 + 1000).runs
    out = proc.on_ack(ack(run, State.SUCCEEDED, T0 + 1010), T0 + 1010)
    assert [(e.state, e.run_id) for e in out.status] == [(State.COMPLETED, None)]
    assert proc.load("j").status.shown == "COMPLETED"


def test_a_replayed_run_gets_retries_of_its_own_then_is_dead_again(proc):
    dead = dead_run(proc, max_attempts=2)
    [r3] = proc.on_command(cmd("j", replay_of(dead)), T0 + 1000).runs
    out = proc.on_ack(
        ack(r3, State.FAILED, T0 + 1010, error="E: again", retry_delay_ms=0), T0 + 1010
    )
    assert [e.state for e in out.status] == [State.RETRYING]
    [r4] = proc.punctuate(T0 + 1010, 10)[0].runs
    assert r4.attempt == 4
    out = proc.on_ack(
        ack(r4, State.FAILED, T0 + 1020, error="E: again", retry_delay_ms=0), T0 + 1020
    )
    # the run is DEAD again; the job was DEAD all along, so it has no new event
    assert [(e.state, e.run_id) for e in out.status] == [(State.DEAD, dead.run_id)]
    assert "attempt 4 of 4" in out.status[0].reason
    assert out.dead_runs[0][0].attempt == 4  # back on the dead-letter topic, replayable again


def test_a_replay_of_a_forgotten_job_recreates_it_and_its_events_sort_after_the_old_ones():
    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()), retention_ms=60_000)
    dead = dead_run(proc)
    old_seq = proc.load("j").seq
    proc.punctuate(T0 + 120_000, 10)
    assert proc.load("j") is None  # forgotten after the retention
    at = T0 + 200_000
    out = proc.on_command(cmd("j", replay_of(dead), at=at), at)
    [run] = out.runs
    assert (run.run_id, run.attempt, run.task, run.args_json) == (
        dead.run_id,
        dead.attempt + 1,
        dead.task,
        dead.args_json,
    )
    assert out.status[0].seq > old_seq
    job = proc.load("j")
    assert job.status.shown == "DEAD" and job.next_fire_ms is None
    out = proc.on_ack(ack(run, State.SUCCEEDED, at + 5), at + 5)
    assert [e.state for e in out.status] == [State.COMPLETED]
    assert proc.next_due_ms() == at + 5 + 60_000  # retired again, nothing else pending


def test_a_replay_runs_the_current_definition_of_a_job_scheduled_again_with_a_fix(proc):
    dead = dead_run(proc)
    fixed = ScheduleJob(task="demo.fixed", trigger=Now(), args_json='{"n": 2}')
    proc.on_command(cmd("j", fixed), T0 + 500)
    [fresh] = proc.punctuate(T0 + 500, 10)[0].runs
    proc.on_ack(ack(fresh, State.SUCCEEDED, T0 + 510), T0 + 510)
    [run] = proc.on_command(cmd("j", replay_of(dead)), T0 + 1000).runs
    assert (run.run_id, run.task, run.args_json) == (dead.run_id, "demo.fixed", '{"n": 2}')


def test_a_replay_is_refused_for_a_cancelled_job_and_for_a_run_in_flight(proc):
    dead = dead_run(proc)
    c = cmd("j", replay_of(dead))
    [run] = proc.on_command(c, T0 + 1000).runs
    out = proc.on_command(cmd("j", replay_of(dead)), T0 + 1001)
    assert [e.state for e in out.status] == [State.REJECTED] and out.runs == []
    assert "in flight" in out.status[0].reason
    assert proc.on_command(c, T0 + 1002).status == []  # a redelivered command: applied once

    proc.on_command(cmd("k", ScheduleJob(task="t", trigger=Now())), T0)
    proc.on_command(cmd("k", CancelJob()), T0 + 1)
    ghost = ReplayRun(run_id=f"k@{T0}", scheduled_time_ms=T0, attempt=3, task="t")
    out = proc.on_command(cmd("k", ghost), T0 + 2)
    assert [e.state for e in out.status] == [State.REJECTED] and out.runs == []
    assert "CANCELLED" in out.status[0].reason


def test_the_replay_allowance_survives_the_job_record_encoding(proc):
    dead = dead_run(proc)
    proc.on_command(cmd("j", replay_of(dead)), T0 + 1000)
    [active] = decode_job(encode_job(proc.load("j"))).active.values()
    assert (active.attempt, active.base) == (dead.attempt + 1, dead.attempt)


def test_replay_commands_round_trip_and_are_checked_like_every_command():
    body = ReplayRun(
        run_id=f"job-ü@trigger-{T0}",
        scheduled_time_ms=T0,
        attempt=3,
        task="demo.echo",
        args_json='{"a": [1, 2]}',
        max_attempts=5,
        timeout_ms=1000,
        visibility_timeout_ms=9000,
        reason="fixed",
    )
    command = JobCommand("c-1", "job-ü", T0, body)
    assert default_codec().decode(default_codec().encode(command)) == command
    check_command(command, now_ms=T0, max_args_bytes=65536)
    for bad, field in [
        (JobCommand("c-2", "other", T0, body), "run_id"),  # another job's run
        (JobCommand("c-3", "job-ü", T0, ReplayRun(f"job-ü@{T0}", T0, 0, "demo.echo")), "attempt"),
        (JobCommand("c-4", "job-ü", T0, ReplayRun(f"job-ü@{T0}", T0, 1, "bad task")), "task"),
        (JobCommand("c-5", "job-ü", T0, ReplayRun(f"job-ü@{T0}", T0, 1, "t", "{")), "args"),
    ]:
        with pytest.raises(ValidationError) as info:
            check_command(bad, now_ms=T0, max_args_bytes=65536)
        assert info.value.field == field


def test_the_same_dead_letter_replayed_twice_does_not_dispatch_its_attempt_again(proc):
    """Two replays of one dead letter (attempt 2) after the first replay's run finished: the
    second would dispatch run id and attempt 3 again, and its worker events would merge with
    the first replay's in the status store. It is REJECTED under its own command id, naming
    the attempt a replay dispatched; a redelivery of either command is still a silent repeat,
    and the run's later dead letter replays."""
    dead = dead_run(proc)
    first = cmd("j", replay_of(dead), at=T0 + 1000)
    [run] = proc.on_command(first, T0 + 1000).runs
    assert (run.run_id, run.attempt) == (dead.run_id, 3)
    proc.on_ack(ack(run, State.SUCCEEDED, T0 + 1010), T0 + 1010)
    assert proc.load("j").status.shown == "COMPLETED"

    second = cmd("j", replay_of(dead), at=T0 + 2000)
    out = proc.on_command(second, T0 + 2000)
    assert out.runs == []
    [refused] = out.status
    assert (refused.state, refused.event_id) == (State.REJECTED, f"{second.command_id}:REJECTED")
    assert dead.run_id in refused.reason and "attempt 3 already" in refused.reason
    assert not proc.on_command(first, T0 + 2001) and not proc.on_command(second, T0 + 2001)

    # A replay that dies again leaves a later letter: that one replays, the old one does not.
    other = dead_run(proc, "k", max_attempts=1)
    [r2] = proc.on_command(cmd("k", replay_of(other)), T0 + 3000).runs
    out = proc.on_ack(ack(r2, State.FAILED, T0 + 3010, error="E: again"), T0 + 3010)
    [(again, _)] = out.dead_runs
    assert again.attempt == 2
    [r3] = proc.on_command(cmd("k", replay_of(again)), T0 + 3020).runs
    assert r3.attempt == 3
    proc.on_ack(ack(r3, State.SUCCEEDED, T0 + 3030), T0 + 3030)
    for letter in (other, again):
        out = proc.on_command(cmd("k", replay_of(letter)), T0 + 3040)
        assert out.runs == [] and [e.state for e in out.status] == [State.REJECTED]


def test_the_replays_a_job_no_longer_remembers_still_refuse_their_runs(proc):
    """The record keeps its latest replayed runs and the latest scheduled time of one it
    forgot (kept across an encode/decode): a letter of a run scheduled no later than that may
    have been replayed, and is refused; a later run replays."""
    from jobwheel.streams.jobstate import RECENT_REPLAYS

    proc.on_command(cmd("j", ScheduleJob(task="t", trigger=Now())), T0)
    job = proc.load("j")
    for i in range(RECENT_REPLAYS + 2):
        job.remember_replay(f"j@{T0 + i}", T0 + i, 4)
    proc.save(job)
    job = proc.load("j")
    assert len(job.replays) == RECENT_REPLAYS and job.replay_floor == T0 + 1
    assert decode_job(encode_job(job)) == job
    proc.save(job)
    ghost = ReplayRun(run_id=f"j@{T0 + 1}", scheduled_time_ms=T0 + 1, attempt=3, task="t")
    out = proc.on_command(cmd("j", ghost), T0 + 10)
    assert out.runs == [] and "may have been replayed" in out.status[0].reason
    later = ReplayRun(run_id=f"j@{T0 + 500}", scheduled_time_ms=T0 + 500, attempt=3, task="t")
    assert proc.on_command(cmd("j", later), T0 + 11).runs


def test_a_job_record_written_before_replay_memory_existed_still_loads(proc):
    import json

    dead_run(proc)
    raw = encode_job(proc.load("j"))
    at = raw.index(b'{"job_id"')
    head, body = raw[:at], json.loads(raw[at:])
    del body["replays"], body["replay_floor"]
    old = decode_job(head + json.dumps(body).encode())
    assert old.replays == {} and old.replay_floor is None
