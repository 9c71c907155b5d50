"""The scheduler's rules, record by record, with time passed in (no broker)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import (
    At,
    CancelJob,
    ConcurrencyPolicy,
    Cron,
    Every,
    JobCommand,
    Now,
    PauseJob,
    ResumeJob,
    ScheduleJob,
    State,
    StatusEvent,
    TriggerJob,
)
from jobwheel.schemas.validation import MAX_DURATION_MS
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState

T0 = 1_800_000_000_000  # 2027-01-15, an arbitrary fixed instant
_ids = itertools.count()
CODEC = default_codec()


def cmd(job_id: str, body, at: int = T0) -> JobCommand:
    return JobCommand(command_id=f"c{next(_ids)}", job_id=job_id, issued_at_ms=at, body=body)


def spec(trigger, **kw) -> ScheduleJob:
    return ScheduleJob(task="demo.echo", trigger=trigger, **kw)


@pytest.fixture
def proc() -> SchedulerProcessor:
    return SchedulerProcessor(3, PartitionState(MemoryBackend()), 7)


def states(out) -> list[State]:
    return [e.state for e in out.status]


def ack(run, state: State, at: int, **kw) -> StatusEvent:
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


def test_now_job_fires_once_with_a_stable_run_id_and_the_fencing_token(proc):
    out = proc.on_command(cmd("j1", spec(Now())), T0)
    assert states(out) == [State.SCHEDULED]
    assert out.status[0].next_fire_ms == T0
    out, due = proc.punctuate(T0 + 5, 100)
    assert due == 1
    [run] = out.runs
    assert (run.run_id, run.attempt, run.scheduled_time_ms) == (f"j1@{T0}", 1, T0)
    assert (run.partition, run.fencing_token, run.dispatched_at_ms) == (3, 7, T0 + 5)
    assert run.deadline_ms == T0 + 5 + 30_000
    assert states(out) == [State.DISPATCHED]
    assert out.status[0].seq == run.seq > 1
    out, due = proc.punctuate(T0 + 10, 100)
    assert out.runs == [] and due == 0


def test_at_job_does_not_fire_early(proc):
    proc.on_command(cmd("j", spec(At(T0 + 1000))), T0)
    assert proc.punctuate(T0 + 999, 100)[0].runs == []
    assert [r.scheduled_time_ms for r in proc.punctuate(T0 + 1000, 100)[0].runs] == [T0 + 1000]


def test_interval_job_fires_every_interval(proc):
    proc.on_command(cmd("j", spec(Every(1000))), T0)
    fired = []
    for t in range(T0, T0 + 3500, 100):
        fired += [r.scheduled_time_ms for r in proc.punctuate(t, 100)[0].runs]
    assert fired == [T0 + 1000, T0 + 2000, T0 + 3000]


def test_cron_job_fires_on_its_schedule_in_its_zone(proc):
    # 2027-01-15 is a Friday; "0 9 * * *" in Europe/Berlin (UTC+1 in winter) is 08:00 UTC.
    from datetime import UTC, datetime

    start = int(datetime(2027, 1, 15, 7, 0, tzinfo=UTC).timestamp() * 1000)
    proc.on_command(cmd("c", spec(Cron("0 9 * * *", "Europe/Berlin")), at=start), start)
    expected = int(datetime(2027, 1, 15, 8, 0, tzinfo=UTC).timestamp() * 1000)
    assert proc.punctuate(expected - 1, 10)[0].runs == []
    [run] = proc.punctuate(expected, 10)[0].runs
    assert run.scheduled_time_ms == expected
    assert proc.load("c").next_fire_ms == expected + 24 * 3600 * 1000


def test_cancel_before_fire_means_no_fire(proc):
    proc.on_command(cmd("j", spec(At(T0 + 1000))), T0)
    out = proc.on_command(cmd("j", CancelJob("user asked")), T0 + 10)
    assert states(out) == [State.CANCELLED]
    assert out.status[0].reason == "user asked"
    assert proc.punctuate(T0 + 5000, 100)[0].runs == []


@pytest.mark.parametrize("body", [CancelJob(), PauseJob(), ResumeJob(), TriggerJob()])
def test_commands_for_unknown_jobs_are_rejected(proc, body):
    out = proc.on_command(cmd("ghost", body), T0)
    assert states(out) == [State.REJECTED]
    assert "unknown job" in out.status[0].reason


def test_invalid_spec_is_rejected_not_scheduled(proc):
    out = proc.on_command(cmd("bad", spec(Every(0))), T0)
    assert states(out) == [State.REJECTED]
    assert "every: must be positive" in out.status[0].reason
    assert out.rejected == out.status[0].reason  # the engine dead-letters the record
    assert proc.load("bad") is None


def test_an_interval_under_the_minimum_is_rejected_and_never_fires(proc):
    """``every 1ms`` flooded ~600 runs a second (and MISSED events) from one job."""
    out = proc.on_command(cmd("flood", spec(Every(1))), T0)
    assert states(out) == [State.REJECTED] and out.rejected
    assert "shorter than the shortest interval, 1000 ms" in out.status[0].reason
    assert proc.load("flood") is None and proc.punctuate(T0 + 60_000, 100)[0].runs == []
    assert states(proc.on_command(cmd("ok", spec(Every(1000))), T0)) == [State.SCHEDULED]


def test_a_redelivered_command_is_applied_once(proc):
    c = cmd("j", spec(Now()))
    assert states(proc.on_command(c, T0)) == [State.SCHEDULED]
    assert proc.on_command(c, T0 + 1).status == []
    assert len(proc.punctuate(T0 + 2, 100)[0].runs) == 1


def test_same_idempotency_key_is_applied_once(proc):
    proc.on_command(cmd("j", spec(At(T0 + 100), idempotency_key="k")), T0)
    assert proc.on_command(cmd("j", spec(At(T0 + 100), idempotency_key="k")), T0).status == []
    assert len(proc.punctuate(T0 + 100, 100)[0].runs) == 1


def test_pause_stops_fires_and_resume_runs_only_the_latest_missed(proc):
    proc.on_command(cmd("j", spec(Every(1000))), T0)
    assert states(proc.on_command(cmd("j", PauseJob()), T0 + 500)) == [State.PAUSED]
    assert proc.punctuate(T0 + 4500, 100)[0].runs == []
    assert states(proc.on_command(cmd("j", ResumeJob()), T0 + 4600)) == [State.RESUMED]
    out, _ = proc.punctuate(T0 + 4600, 100)
    # Fires due at +1000, +2000, +3000, +4000: the last runs, the rest are MISSED.
    assert [r.scheduled_time_ms for r in out.runs] == [T0 + 4000]
    missed = [e.scheduled_time_ms for e in out.status if e.state is State.MISSED]
    assert missed == [T0 + 1000, T0 + 2000, T0 + 3000]
    assert proc.load("j").next_fire_ms == T0 + 5000


def test_starting_deadline_turns_a_late_fire_into_missed(proc):
    proc.on_command(cmd("j", spec(At(T0 + 1000), starting_deadline_ms=500)), T0)
    out, _ = proc.punctuate(T0 + 1600, 100)
    assert out.runs == []
    assert states(out) == [State.MISSED, State.COMPLETED]
    assert "starting deadline" in out.status[0].reason


def test_within_starting_deadline_still_runs(proc):
    proc.on_command(cmd("j", spec(At(T0 + 1000), starting_deadline_ms=500)), T0)
    assert len(proc.punctuate(T0 + 1400, 100)[0].runs) == 1


def test_forbid_skips_while_a_run_is_active(proc):
    proc.on_command(cmd("j", spec(Every(1000), concurrency_policy=ConcurrencyPolicy.FORBID)), T0)
    [first] = proc.punctuate(T0 + 1000, 100)[0].runs
    out, _ = proc.punctuate(T0 + 2000, 100)
    assert out.runs == [] and states(out) == [State.SKIPPED]
    assert first.run_id in out.status[0].reason
    proc.on_ack(ack(first, State.SUCCEEDED, T0 + 2100), T0 + 2100)
    assert [r.scheduled_time_ms for r in proc.punctuate(T0 + 3000, 100)[0].runs] == [T0 + 3000]


def test_replace_cancels_the_active_run_and_starts_the_new_one(proc):
    proc.on_command(cmd("j", spec(Every(1000), concurrency_policy=ConcurrencyPolicy.REPLACE)), T0)
    [first] = proc.punctuate(T0 + 1000, 100)[0].runs
    out, _ = proc.punctuate(T0 + 2000, 100)
    assert states(out) == [State.CANCELLED, State.DISPATCHED]
    assert out.status[0].run_id == first.run_id
    assert [r.scheduled_time_ms for r in out.runs] == [T0 + 2000]
    # The replaced run's late verdict changes nothing, and it is never redelivered.
    assert proc.on_ack(ack(first, State.SUCCEEDED, T0 + 2100), T0 + 2100).status == []
    late = proc.punctuate(T0 + 1000 + 31_000, 100)[0]
    assert first.run_id not in [r.run_id for r in late.runs]


def test_allow_runs_overlapping(proc):
    proc.on_command(cmd("j", spec(Every(1000))), T0)
    proc.punctuate(T0 + 1000, 100)
    assert len(proc.punctuate(T0 + 2000, 100)[0].runs) == 1
    assert len(proc.load("j").active) == 2


def test_visibility_timeout_redispatches_the_same_run_with_the_next_attempt(proc):
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000, max_attempts=3)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    assert proc.punctuate(T0 + 999, 100)[0].runs == []
    [again] = proc.punctuate(T0 + 1000, 100)[0].runs
    assert (again.run_id, again.attempt) == (run.run_id, 2)
    assert again.seq > run.seq
    # Attempt 1's failure now is old news and ignored...
    assert proc.on_ack(ack(run, State.FAILED, T0 + 1001, retry_delay_ms=5), T0 + 1001).status == []
    assert proc.load("j").active[run.run_id].attempt == 2
    # ...but its success completes the run: the work is done, no more redelivery.
    out = proc.on_ack(ack(run, State.SUCCEEDED, T0 + 1002), T0 + 1002)
    assert states(out) == [State.COMPLETED]
    assert proc.punctuate(T0 + 60_000, 100)[0].runs == []


def test_heartbeat_extends_the_deadline(proc):
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    proc.on_ack(ack(run, State.STARTED, T0 + 10), T0 + 10)
    for t in range(T0 + 500, T0 + 5000, 500):
        proc.on_ack(ack(run, State.HEARTBEAT, t, deadline_ms=t + 1000), t)
        assert proc.punctuate(t, 100)[0].runs == []
    out = proc.on_ack(ack(run, State.SUCCEEDED, T0 + 5000), T0 + 5000)
    assert states(out) == [State.COMPLETED]
    assert proc.punctuate(T0 + 60_000, 100)[0].runs == []


def test_out_of_attempts_on_visibility_timeout_is_dead(proc):
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000, max_attempts=2)), T0)
    proc.punctuate(T0, 100)
    proc.punctuate(T0 + 1000, 100)
    out, _ = proc.punctuate(T0 + 2000, 100)
    assert out.runs == []
    # The run is DEAD, and so is the one-off job it was (not COMPLETED: it did not succeed).
    assert states(out) == [State.DEAD, State.DEAD]
    assert [e.run_id for e in out.status] == [f"j@{T0}", None]
    [(dead_run, reason)] = out.dead_runs
    assert dead_run.attempt == 2 and "visibility timeout" in reason


def test_failed_is_retried_after_the_workers_backoff_then_dead(proc):
    proc.on_command(cmd("j", spec(Now(), max_attempts=3)), T0)
    [r1] = proc.punctuate(T0, 100)[0].runs
    out = proc.on_ack(ack(r1, State.FAILED, T0 + 10, error="E: boom", retry_delay_ms=200), T0 + 10)
    assert states(out) == [State.RETRYING]
    assert proc.punctuate(T0 + 209, 100)[0].runs == []
    [r2] = proc.punctuate(T0 + 210, 100)[0].runs
    assert (r2.run_id, r2.attempt) == (r1.run_id, 2)
    proc.on_ack(ack(r2, State.FAILED, T0 + 300, error="E: boom", retry_delay_ms=0), T0 + 300)
    [r3] = proc.punctuate(T0 + 300, 100)[0].runs
    assert r3.attempt == 3
    out = proc.on_ack(ack(r3, State.FAILED, T0 + 400, error="E: boom", retry_delay_ms=0), T0 + 400)
    assert states(out) == [State.DEAD, State.DEAD]  # the run, then the job (its last run died)
    assert out.status[1].run_id is None and "E: boom" in out.status[1].reason
    assert out.dead_runs[0][0].attempt == 3
    assert proc.load("j").last_error is not None


def test_a_run_dead_on_its_last_attempt_says_its_attempts_were_used_up(proc):
    """The worker sends no retry delay on the last attempt it allows (its own count, which may
    be the task's lower limit): the run's DEAD reason says the attempts were used up, with the
    worker's words, never "not retryable" as if the error itself were not worth a retry."""
    proc.on_command(cmd("j", spec(Now(), max_attempts=2)), T0)
    [r1] = proc.punctuate(T0, 100)[0].runs
    proc.on_ack(ack(r1, State.FAILED, T0 + 10, error="E: boom", retry_delay_ms=0), T0 + 10)
    [r2] = proc.punctuate(T0 + 10, 100)[0].runs
    worker_said = "task raised an exception; attempts exhausted (2 of 2)"
    out = proc.on_ack(ack(r2, State.FAILED, T0 + 20, error="E: boom", reason=worker_said), T0 + 20)
    [run_dead] = [e for e in out.status if e.run_id is not None and e.state is State.DEAD]
    assert "not retryable" not in run_dead.reason, run_dead.reason
    assert "attempt 2 of 2 failed" in run_dead.reason and "E: boom" in run_dead.reason
    # A failure the worker marks not worth retrying, attempts left, still says so, with why.
    proc.on_command(cmd("k", spec(Now(), max_attempts=5)), T0)
    [k1] = proc.punctuate(T0 + 30, 100)[0].runs
    out = proc.on_ack(
        ack(k1, State.FAILED, T0 + 40, error="unknown task", reason="task not registered"),
        T0 + 40,
    )
    [k_dead] = [e for e in out.status if e.run_id is not None and e.state is State.DEAD]
    assert "not retried" in k_dead.reason and "task not registered" in k_dead.reason


def test_failed_without_retry_delay_is_dead_at_once(proc):
    proc.on_command(cmd("j", spec(Now(), max_attempts=5)), T0)
    [r1] = proc.punctuate(T0, 100)[0].runs
    out = proc.on_ack(ack(r1, State.FAILED, T0 + 5, error="unknown task"), T0 + 5)
    assert State.DEAD in states(out)


@pytest.mark.parametrize("attempt", [0, -7, -(2**63)])
@pytest.mark.parametrize("state", [State.SUCCEEDED, State.FAILED, State.STARTED, State.HEARTBEAT])
def test_an_ack_naming_an_impossible_attempt_is_refused_and_the_run_goes_on(proc, attempt, state):
    """Attempts count from 1. An ack naming attempt 0 or below is no attempt's news (a forged
    or corrupt record): taken as an older attempt's SUCCEEDED, it completed a run still
    running. It is refused (the engine dead-letters it) and changes nothing."""
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000, max_attempts=3)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    before = proc.load("j")
    forged = dataclasses.replace(
        ack(run, state, T0 + 5, error="E: x", retry_delay_ms=0), attempt=attempt
    )
    out = proc.on_ack(forged, T0 + 5)
    assert out.status == [] and out.runs == [] and out.dead_runs == []
    assert out.rejected is not None
    assert f"attempt {attempt}" in out.rejected and run.run_id in out.rejected
    assert proc.load("j") == before  # still running, deadline unmoved
    # The real attempt's verdict still counts.
    out = proc.on_ack(ack(run, State.SUCCEEDED, T0 + 10), T0 + 10)
    assert states(out) == [State.COMPLETED]


def test_a_valid_ack_is_not_refused(proc):
    proc.on_command(cmd("j", spec(Now())), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    assert proc.on_ack(ack(run, State.STARTED, T0 + 1), T0 + 1).rejected is None
    assert proc.on_ack(ack(run, State.SUCCEEDED, T0 + 2), T0 + 2).rejected is None


@pytest.mark.parametrize("delay", [MAX_DURATION_MS + 1, 2**63 - 1])
def test_a_retry_delay_past_the_largest_duration_is_cut_to_it(proc, delay):
    """A task's Retry(delay_ms=2**63 - 1) reaches the scheduler as the FAILED ack's
    retry_delay_ms: the retry is due at most MAX_DURATION_MS after the failure, an instant
    an int64 holds (the timer, the event and the changelog record all carry it)."""
    proc.on_command(cmd("j", spec(Now(), max_attempts=3)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    out = proc.on_ack(ack(run, State.FAILED, T0 + 10, error="E: x", retry_delay_ms=delay), T0 + 10)
    [retrying] = out.status
    assert retrying.state is State.RETRYING
    assert retrying.retry_delay_ms == MAX_DURATION_MS
    assert f"in {MAX_DURATION_MS} ms" in retrying.reason
    waiting = proc.load("j").active[run.run_id]
    assert waiting.due_ms == T0 + 10 + MAX_DURATION_MS < 2**63
    assert proc.next_due_ms() == waiting.due_ms
    assert CODEC.decode(CODEC.encode(retrying)) == retrying


def test_trigger_runs_now_regardless_of_schedule(proc):
    proc.on_command(cmd("j", spec(Every(3_600_000))), T0)
    out = proc.on_command(cmd("j", TriggerJob(), at=T0 + 50), T0 + 60)
    [run] = out.runs
    assert run.run_id == f"j@trigger-{T0 + 50}"


def test_two_triggers_issued_in_the_same_ms_do_not_share_a_run(proc):
    """A trigger's run is named by its issue time. A second trigger issued in the same
    millisecond, while the first runs or after it finished, is refused with a REJECTED event
    under its own command id: it never runs under the first one's run id (whose events it
    would merge with)."""
    proc.on_command(cmd("j", spec(Every(3_600_000))), T0)
    at = T0 + 50
    first = cmd("j", TriggerJob("first"), at=at)
    [run] = proc.on_command(first, T0 + 60).runs
    assert run.run_id == f"j@trigger-{at}"

    second = cmd("j", TriggerJob("second, same ms"), at=at)
    out = proc.on_command(second, T0 + 61)
    assert out.runs == []
    [refused] = out.status
    assert refused.state is State.REJECTED and refused.event_id == f"{second.command_id}:REJECTED"
    assert f"j@trigger-{at}" in refused.reason and "is running" in refused.reason

    proc.on_ack(ack(run, State.SUCCEEDED, T0 + 70), T0 + 70)
    assert proc.load("j").active == {}
    third = cmd("j", TriggerJob("third, after the first finished"), at=at)
    out = proc.on_command(third, T0 + 80)
    assert out.runs == [] and states(out) == [State.REJECTED]
    assert "has run" in out.status[0].reason

    # The same command delivered again is still a repeat, not a second verdict ...
    assert not proc.on_command(first, T0 + 90)
    assert not proc.on_command(second, T0 + 90)
    # ... and a trigger of another instant runs.
    [other] = proc.on_command(cmd("j", TriggerJob(), at=at + 1), T0 + 91).runs
    assert other.run_id == f"j@trigger-{at + 1}"


def test_the_triggers_a_job_no_longer_remembers_still_refuse_their_instants(proc):
    """The record keeps the issue times of its last triggers, and the latest one it forgot:
    a trigger issued at or before that may share a run id with a forgotten run."""
    from jobwheel.streams.jobstate import RECENT_COMMANDS, decode_job, encode_job

    proc.on_command(cmd("j", spec(Every(3_600_000))), T0)
    for i in range(RECENT_COMMANDS + 3):
        [run] = proc.on_command(cmd("j", TriggerJob(), at=T0 + i), T0 + 100 + i).runs
        proc.on_ack(ack(run, State.SUCCEEDED, T0 + 100 + i), T0 + 100 + i)
    job = proc.load("j")
    assert len(job.recent_triggers) == RECENT_COMMANDS and job.trigger_floor == T0 + 2
    assert decode_job(encode_job(job)) == job  # kept across a restore
    out = proc.on_command(cmd("j", TriggerJob(), at=T0), T0 + 200)
    assert states(out) == [State.REJECTED] and "may have run" in out.status[0].reason
    out = proc.on_command(cmd("j", TriggerJob(), at=T0 + RECENT_COMMANDS + 2), T0 + 200)
    assert states(out) == [State.REJECTED] and "has run" in out.status[0].reason
    assert proc.on_command(cmd("j", TriggerJob(), at=T0 + 1_000), T0 + 200).runs


def test_a_job_record_written_before_trigger_memory_existed_still_loads():
    import json

    from jobwheel.streams.jobstate import decode_job, encode_job

    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()))
    proc.on_command(cmd("j", spec(Every(60_000))), T0)
    raw = encode_job(proc.load("j"))
    at = raw.index(b'{"job_id"')
    head, body = raw[:at], json.loads(raw[at:])
    del body["triggers"], body["trigger_floor"]
    old = decode_job(head + json.dumps(body).encode())
    assert old.recent_triggers == [] and old.trigger_floor is None


def test_discarded_batch_fires_again_with_the_same_run_id():
    state = PartitionState(MemoryBackend())
    proc = SchedulerProcessor(0, state)
    proc.on_command(cmd("j", spec(Now())), T0)
    state.commit(checkpoint=None)
    [first] = proc.punctuate(T0, 10)[0].runs
    state.discard()  # the transaction aborted (fenced, broker error): nothing was recorded
    [again] = proc.punctuate(T0 + 50, 10)[0].runs
    assert again.run_id == first.run_id and again.attempt == 1


def test_batches_respect_the_limit(proc):
    for i in range(25):
        proc.on_command(cmd(f"j{i}", spec(At(T0 + i))), T0)
    out, due = proc.punctuate(T0 + 100, 10)
    assert due == 10 and len(out.runs) == 10
    assert [r.scheduled_time_ms for r in out.runs] == sorted(r.scheduled_time_ms for r in out.runs)
    total = 10
    while True:
        out, due = proc.punctuate(T0 + 100, 10)
        if not due:
            break
        total += len(out.runs)
    assert total == 25


def test_far_behind_interval_job_runs_the_latest_and_reports_the_rest_compactly(proc):
    proc.on_command(cmd("j", spec(Every(1000))), T0)
    day = 24 * 3600 * 1000
    out, _ = proc.punctuate(T0 + day + 500, 10)
    [run] = out.runs
    assert run.scheduled_time_ms == T0 + day
    missed = [e for e in out.status if e.state is State.MISSED]
    assert len(missed) == 101  # 100 individual events, then one summary
    assert "more scheduled times missed" in missed[-1].reason
    assert proc.load("j").next_fire_ms == T0 + day + 1000


def test_a_handed_back_run_is_redispatched_at_once_and_not_counted_as_a_failure(proc):
    from jobwheel.schemas.models import HANDBACK_REASON

    proc.on_command(cmd("j", spec(Now(), max_attempts=1)), T0)
    [r1] = proc.punctuate(T0, 10)[0].runs
    out = proc.on_ack(
        ack(r1, State.FAILED, T0 + 5, reason=HANDBACK_REASON, retry_delay_ms=0), T0 + 5
    )
    [r2] = out.runs
    assert (r2.run_id, r2.attempt, r2.max_attempts) == (r1.run_id, 2, 2)
    assert State.DEAD not in states(out)
    # A real failure of the redispatched attempt is then the last one allowed.
    out = proc.on_ack(ack(r2, State.FAILED, T0 + 9, error="E: x", retry_delay_ms=100), T0 + 9)
    assert State.DEAD in states(out)


def test_finished_jobs_are_forgotten_after_the_retention():
    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()), retention_ms=60_000)
    c = cmd("j", spec(Now()))
    proc.on_command(c, T0)
    [run] = proc.punctuate(T0, 10)[0].runs
    proc.on_ack(ack(run, State.SUCCEEDED, T0 + 5), T0 + 5)
    proc.punctuate(T0 + 59_000, 10)
    assert proc.load("j") is not None  # within the retention a redelivered command is known
    assert proc.on_command(c, T0 + 59_000).status == []
    proc.punctuate(T0 + 60_005, 10)
    assert proc.load("j") is None
    assert proc.next_due_ms() is None  # nothing left behind in the wheels either


def test_a_rescheduled_job_is_not_forgotten(proc):
    proc.retention_ms = 1000
    proc.on_command(cmd("j", spec(Now())), T0)
    proc.on_command(cmd("j", CancelJob()), T0 + 1)
    proc.on_command(cmd("j", spec(At(T0 + 5000))), T0 + 2)
    proc.punctuate(T0 + 2000, 10)
    assert proc.load("j") is not None
    assert [r.scheduled_time_ms for r in proc.punctuate(T0 + 5000, 10)[0].runs] == [T0 + 5000]


def test_a_backlog_is_worked_off_in_bounded_chunks(proc):
    """A day of downtime for 50 one-second jobs: each punctuation stays within its record
    budget, and together they fire every job once (the latest time) with its MISSED summary."""
    for i in range(50):
        proc.on_command(cmd(f"j{i}", spec(Every(1000))), T0)
    now = T0 + 24 * 3600 * 1000
    fired: list[str] = []
    chunks = 0
    while True:
        out, handled = proc.punctuate(now, 1000, max_records=500)
        if not handled:
            break
        chunks += 1
        assert out.size <= 500 + 102  # one job's output may cross the budget once
        fired += [r.job_id for r in out.runs]
    assert sorted(fired) == sorted(f"j{i}" for i in range(50))
    assert chunks >= 10  # 50 x (1 run + 1 DISPATCHED + 101 MISSED) over a 500-record budget


def test_a_deadline_expires_only_once_the_acks_before_it_have_been_read(proc):
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    # Long past the deadline by the clock, but the acks are read only up to before it: the
    # verdict may be waiting unread, so nothing is dispatched again.
    assert proc.punctuate(T0 + 5000, 100, deadline_watermark=T0 + 999)[0].runs == []
    assert proc.next_due_ms(deadline_watermark=T0 + 999) is None  # nothing to wake up for
    # The verdict was there: read now, it completes the run.
    out = proc.on_ack(ack(run, State.SUCCEEDED, T0 + 800), T0 + 5001, ack_time_ms=T0 + 800)
    assert states(out) == [State.COMPLETED]
    assert proc.punctuate(T0 + 9000, 100, deadline_watermark=T0 + 9000)[0].runs == []


def test_a_deadline_past_the_watermark_dispatches_the_next_attempt(proc):
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    [again] = proc.punctuate(T0 + 5000, 100, deadline_watermark=T0 + 1000)[0].runs
    assert (again.run_id, again.attempt) == (run.run_id, 2)


def test_a_run_started_again_after_its_deadline_is_not_dispatched_twice(proc):
    """After a worker crash the partition's next worker runs the unfinished attempt again; its
    STARTED, written after the old deadline, keeps the run alive."""
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    proc.on_ack(ack(run, State.STARTED, T0 + 7000), T0 + 7005, ack_time_ms=T0 + 7000)
    assert proc.punctuate(T0 + 7005, 100, deadline_watermark=T0 + 7000)[0].runs == []
    assert proc.load("j").active[run.run_id].due_ms == T0 + 8000


def test_the_deadline_comes_from_the_broker_time_of_the_ack_not_from_the_worker(proc):
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    # A worker (or a forger) claiming a deadline an hour away changes nothing.
    proc.on_ack(
        ack(run, State.HEARTBEAT, T0 + 500, deadline_ms=T0 + 3_600_000),
        T0 + 600,
        ack_time_ms=T0 + 500,
    )
    assert proc.load("j").active[run.run_id].due_ms == T0 + 1500
    [again] = proc.punctuate(T0 + 1500, 100, deadline_watermark=T0 + 1500)[0].runs
    assert again.attempt == 2


# --- the job state model (README, "Job states") -----------------------------------------------


def job_events(out) -> list[State]:
    """The job-level events of an output (no run id): the only ones that change its state."""
    return [e.state for e in out.status if e.run_id is None]


def test_a_one_off_job_ends_completed_when_its_run_succeeds(proc):
    proc.on_command(cmd("j", spec(Now())), T0)
    [run] = proc.punctuate(T0, 10)[0].runs
    out = proc.on_ack(ack(run, State.SUCCEEDED, T0 + 5), T0 + 5)
    assert job_events(out) == [State.COMPLETED]
    assert proc.load("j").status.shown == "COMPLETED"


def test_rejected_commands_are_events_on_the_job_not_its_state(proc):
    proc.on_command(cmd("j", spec(Every(60_000))), T0)
    resume = cmd("j", ResumeJob())
    out = proc.on_command(resume, T0 + 1)
    assert states(out) == [State.REJECTED]
    assert out.status[0].reason == "cannot resume: job is SCHEDULED, not PAUSED"
    assert out.status[0].event_id == f"{resume.command_id}:REJECTED"
    assert proc.load("j").status.shown == "SCHEDULED"
    proc.on_command(cmd("j", CancelJob()), T0 + 2)
    for body, reason in [
        (CancelJob(), "job is already CANCELLED"),
        (PauseJob(), "cannot pause: job is CANCELLED"),
        (ResumeJob(), "cannot resume: job is CANCELLED, not PAUSED"),
        (TriggerJob(), "cannot trigger: job is CANCELLED"),
    ]:
        out = proc.on_command(cmd("j", body), T0 + 3)
        assert [(e.state, e.reason) for e in out.status] == [(State.REJECTED, reason)]
        assert out.runs == []
        assert proc.load("j").status.shown == "CANCELLED"


def test_a_finished_job_refuses_cancel_and_pause(proc):
    proc.on_command(cmd("j", spec(Now())), T0)
    [run] = proc.punctuate(T0, 10)[0].runs
    proc.on_ack(ack(run, State.SUCCEEDED, T0 + 5), T0 + 5)
    out = proc.on_command(cmd("j", CancelJob()), T0 + 6)
    assert states(out) == [State.REJECTED]
    assert "job is COMPLETED" in out.status[0].reason
    assert states(proc.on_command(cmd("j", PauseJob()), T0 + 7)) == [State.REJECTED]
    assert proc.load("j").status.shown == "COMPLETED"


def test_events_of_a_command_carry_its_id(proc):
    """Whoever sent a command finds the scheduler's verdict by its id."""
    commands = [
        cmd("j", spec(Every(60_000))),
        cmd("j", PauseJob()),
        cmd("j", ResumeJob()),
        cmd("j", CancelJob()),
    ]
    for c in commands:
        [event] = proc.on_command(c, T0).status
        assert event.event_id == f"{c.command_id}:{event.state.value}"
    ghost = cmd("nobody", CancelJob())
    [event] = proc.on_command(ghost, T0).status
    assert (event.state, event.event_id) == (State.REJECTED, f"{ghost.command_id}:REJECTED")


def test_resume_returns_the_job_to_scheduled_with_its_next_fire(proc):
    proc.on_command(cmd("j", spec(Every(60_000))), T0)
    [paused] = proc.on_command(cmd("j", PauseJob()), T0 + 1).status
    assert paused.next_fire_ms is None  # a paused job has no next fire
    [resumed] = proc.on_command(cmd("j", ResumeJob()), T0 + 2).status
    assert resumed.state is State.RESUMED and resumed.next_fire_ms == T0 + 60_000
    assert proc.load("j").status.shown == "SCHEDULED"


def test_a_triggered_run_leaves_a_paused_job_paused(proc):
    proc.on_command(cmd("j", spec(Every(60_000))), T0)
    proc.on_command(cmd("j", PauseJob()), T0 + 1)
    out = proc.on_command(cmd("j", TriggerJob(), at=T0 + 2), T0 + 2)
    [run] = out.runs
    assert job_events(out) == [] and out.status[0].next_fire_ms is None
    # The run dies: the run is DEAD, the job is still PAUSED (and fires nothing).
    proc.on_ack(ack(run, State.STARTED, T0 + 3), T0 + 3)
    out = proc.on_ack(ack(run, State.FAILED, T0 + 4, error="E: x"), T0 + 4)
    assert states(out) == [State.DEAD] and job_events(out) == []
    assert proc.load("j").status.shown == "PAUSED"
    assert proc.punctuate(T0 + 600_000, 10)[0].runs == []


def test_a_one_off_job_that_finished_while_paused_ends_on_resume(proc):
    proc.on_command(cmd("j", spec(Now())), T0)
    [run] = proc.punctuate(T0, 10)[0].runs
    proc.on_command(cmd("j", PauseJob()), T0 + 1)  # its only run is already out
    out = proc.on_ack(ack(run, State.SUCCEEDED, T0 + 5), T0 + 5)
    assert job_events(out) == []  # paused: stays PAUSED
    out = proc.on_command(cmd("j", ResumeJob()), T0 + 6)
    assert job_events(out) == [State.RESUMED, State.COMPLETED]
    assert proc.load("j").status.shown == "COMPLETED"


def test_a_finished_job_triggered_again_ends_as_its_last_run_did(proc):
    proc.on_command(cmd("j", spec(Now(), max_attempts=1)), T0)
    [run] = proc.punctuate(T0, 10)[0].runs
    out = proc.on_ack(ack(run, State.FAILED, T0 + 5, error="E: x"), T0 + 5)
    assert job_events(out) == [State.DEAD]
    [again] = proc.on_command(cmd("j", TriggerJob(), at=T0 + 10), T0 + 10).runs
    assert proc.load("j").status.shown == "DEAD"  # a manual run changes nothing yet ...
    out = proc.on_ack(ack(again, State.SUCCEEDED, T0 + 20), T0 + 20)
    assert job_events(out) == [State.COMPLETED]  # ... its success does
    assert proc.load("j").status.shown == "COMPLETED"


def test_a_job_record_written_before_last_outcome_existed_still_loads():
    import json

    from jobwheel.streams.jobstate import decode_job, encode_job

    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()))
    proc.on_command(cmd("j", spec(Now())), T0)
    raw = encode_job(proc.load("j"))
    at = raw.index(b'{"job_id"')
    head, body = raw[:at], json.loads(raw[at:])
    del body["last_outcome"]
    old = decode_job(head + json.dumps(body).encode())
    assert old.last_outcome is None and old.job_id == "j"


def test_a_run_reported_started_keeps_it_in_its_record_and_older_records_load_unreported():
    """``reported`` decides whether a tie is reached after a restore too, and a record written
    before it existed loads as not reported (waited for: the cautious side)."""
    import json

    from jobwheel.streams.jobstate import decode_job, encode_job

    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()))
    proc.on_command(cmd("j", spec(Now())), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    proc.on_ack(ack(run, State.STARTED, T0 + 5), T0 + 5, T0 + 5)
    raw = encode_job(proc.load("j"))
    assert decode_job(raw).active[run.run_id].reported
    at = raw.index(b'{"job_id"')
    head, body = raw[:at], json.loads(raw[at:])
    body["active"] = [r[:10] for r in body["active"]]
    assert not decode_job(head + json.dumps(body).encode()).active[run.run_id].reported


def test_a_run_still_queued_behind_a_backlog_is_waited_for_not_copied(proc):
    """The partition's worker reports on runs in dispatch order; one dispatched after the last
    it reported on has not been reached: it waits behind other runs, and a second copy would
    only join the same queue."""
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000)), T0)
    [run] = proc.punctuate(T0, 100)[0].runs
    later = T0 + 5000
    out, _ = proc.punctuate(later, 100, deadline_watermark=later, reached_ms=T0 - 1)
    assert out.runs == []
    assert proc.load("j").active[run.run_id].due_ms == later + 1000  # another timeout to go
    # Reached (the worker reported on a run dispatched later than this one): given up on.
    [again] = proc.punctuate(later + 1000, 100, deadline_watermark=later + 1000, reached_ms=T0 + 1)[
        0
    ].runs
    assert again.attempt == 2


def test_the_rest_of_a_burst_is_waited_for_when_the_worker_reported_on_its_first_run(proc):
    """The runs one punctuation fires share their dispatch time: a worker's report on the first
    of them (the partition's furthest report, to the millisecond) says nothing about the others,
    which may still wait behind it. Taking the tie for reached copied every run of a burst still
    queued at its deadline: after a broker outage, a dozen runs executed twice. A run the worker
    said it started is reached, tie or not."""
    for job_id in ("a", "b", "c"):
        proc.on_command(cmd(job_id, spec(Now(), visibility_timeout_ms=1000)), T0)
    runs = {r.job_id: r for r in proc.punctuate(T0, 100)[0].runs}
    assert {r.dispatched_at_ms for r in runs.values()} == {T0}  # one burst, one dispatch time
    proc.on_ack(ack(runs["a"], State.SUCCEEDED, T0 + 1200), T0 + 1200, T0 + 1200)
    proc.on_ack(ack(runs["b"], State.STARTED, T0 + 10), T0 + 1200, T0 + 10)
    # Past b's and c's deadlines, with the worker's furthest report a run dispatched at T0.
    later = T0 + 1500
    [copy] = proc.punctuate(later, 100, deadline_watermark=later, reached_ms=T0)[0].runs
    assert copy.job_id == "b" and copy.attempt == 2  # started, then silent: given up on
    assert proc.load("c").active[runs["c"].run_id].due_ms == later + 1000  # still queued


def test_a_run_never_reached_is_copied_after_ten_timeouts(proc):
    proc.on_command(cmd("j", spec(Now(), visibility_timeout_ms=1000)), T0)
    proc.punctuate(T0, 100)
    t = T0
    while t < T0 + 9_000:
        t += 1000
        assert proc.punctuate(t, 100, deadline_watermark=t, reached_ms=T0 - 1)[0].runs == []
    t += 1000
    [again] = proc.punctuate(t, 100, deadline_watermark=t, reached_ms=T0 - 1)[0].runs
    assert again.attempt == 2
