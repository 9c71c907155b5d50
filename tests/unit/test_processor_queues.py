"""Queues in the scheduler's rules (no broker): a job names its queue and its runs carry it; a
queue the scheduler does not know is REJECTED naming it; and the visibility rules hold per
queue, so one pool's acks never expire the deadlines of another pool's runs."""

from __future__ import annotations

import itertools

from jobwheel.schemas.models import JobCommand, Now, ScheduleJob, State, StatusEvent
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState

T0 = 1_800_000_000_000  # fixed date: an injected clock, never the wall clock
TIMEOUT = 1_000
_ids = itertools.count()


def cmd(job_id: str, queue: str = "default") -> JobCommand:
    body = ScheduleJob("t", Now(), visibility_timeout_ms=TIMEOUT, queue=queue)
    return JobCommand(f"c{next(_ids)}", job_id, T0, body)


def proc() -> SchedulerProcessor:
    return SchedulerProcessor(0, PartitionState(MemoryBackend()), 1, queues=("default", "b"))


def test_runs_and_status_events_carry_the_queue_of_their_job() -> None:
    p = proc()
    scheduled = (
        p.on_command(cmd("ja", "default"), T0).status + p.on_command(cmd("jb", "b"), T0).status
    )
    out = p.punctuate(T0, 100)[0]
    assert sorted((r.job_id, r.queue) for r in out.runs) == [("ja", "default"), ("jb", "b")]
    # the status store shows jobs and runs by queue (status_event.v4): each event names it
    events = scheduled + out.status
    assert {e.state for e in events} == {State.SCHEDULED, State.DISPATCHED}
    assert sorted((e.job_id, e.state.value, e.queue) for e in events) == [
        ("ja", "DISPATCHED", "default"),
        ("ja", "SCHEDULED", "default"),
        ("jb", "DISPATCHED", "b"),
        ("jb", "SCHEDULED", "b"),
    ]


def test_a_job_naming_an_unknown_queue_is_rejected_naming_it_and_how_to_declare_it() -> None:
    p = proc()
    out = p.on_command(cmd("jx", "nope"), T0)
    [event] = out.status
    assert event.state is State.REJECTED
    assert "unknown queue 'nope'" in (event.reason or "")
    assert "JOBWHEEL_QUEUES" in (event.reason or "")
    assert out.rejected == event.reason  # the engine dead-letters it: replayable once declared
    assert p.load("jx") is None and p.punctuate(T0, 100)[0].runs == []


def test_another_pools_acks_do_not_expire_a_queues_deadlines() -> None:
    """Pool B is down: its runs' deadlines pass while pool A acks past them. The partition's
    watermark (any pool's acks) is past B's deadline, B's own is not: no copy of B's run; A's
    run, whose queue's watermark is past its deadline, is dispatched again as before."""
    p = proc()
    p.on_command(cmd("ja", "default"), T0)
    p.on_command(cmd("jb", "b"), T0)
    p.punctuate(T0, 100)
    seen = {"default": T0 + 10 * TIMEOUT}  # pool A acked; pool B said nothing
    t = T0 + 10 * TIMEOUT
    out, _ = p.punctuate(
        t,
        100,
        deadline_watermark=t,
        queue_watermark=lambda q: seen.get(q, 0),
        reached_by_queue={"default": t},
    )
    assert [(r.job_id, r.attempt) for r in out.runs] == [("ja", 2)]
    b = p.load("jb").active[f"jb@{T0}"]
    assert b.attempt == 1 and b.due_ms == t + TIMEOUT and b.deadline_ms == T0 + TIMEOUT
    # Still down a while later: looked at again, still no copy.
    t += 5 * TIMEOUT
    seen["default"] = t
    out, _ = p.punctuate(t, 100, deadline_watermark=t, queue_watermark=lambda q: seen.get(q, 0))
    assert [r.job_id for r in out.runs] == ["ja"]  # A's next timeout; B's run waits
    # B's worker comes back and starts the run: its STARTED moves the deadline it had.
    run = type("R", (), {"run_id": f"jb@{T0}", "job_id": "jb", "attempt": 1, "seq": 2})
    started = StatusEvent("e", "jb", State.STARTED, t, "worker", run_id=run.run_id, attempt=1)
    p.on_ack(started, t, t)
    b = p.load("jb").active[f"jb@{T0}"]
    assert b.deadline_ms == 0 and b.due_ms == t + TIMEOUT
    # B's acks pass the run's deadline without a verdict: now it is given up on, as always.
    t += 2 * TIMEOUT
    seen["b"] = t
    out, _ = p.punctuate(t, 100, deadline_watermark=t, queue_watermark=lambda q: seen.get(q, 0))
    assert ("jb", 2) in [(r.job_id, r.attempt) for r in out.runs]


def test_a_silent_queue_still_has_the_silence_ceiling() -> None:
    """The engine's queue watermark includes the partition's silence ceiling (now minus
    JOBWHEEL_SCHEDULER_ACKS_SILENCE_MS once the acks are read to the end): a queue whose pool
    never comes back has its run copied once the deadline is that far behind, however often
    it was put off before."""
    p = proc()
    p.on_command(cmd("jb", "b"), T0)
    p.punctuate(T0, 100)
    silence = 10 * TIMEOUT
    t = T0
    copies = []
    while not copies:
        t += TIMEOUT
        out, _ = p.punctuate(
            t, 100, deadline_watermark=t, queue_watermark=lambda q, t=t: t - silence
        )
        copies = out.runs
    assert copies[0].attempt == 2
    assert t - (T0 + TIMEOUT) >= silence  # not before the ceiling passed its first deadline


def test_a_run_whose_pool_comes_back_gets_a_timeout_from_then() -> None:
    """B's deadline passed while B had no worker. When B's acks come again (its worker is back,
    working through the backlog several runs at once), the run gets a visibility timeout
    counted from then, not an immediate copy: it may be executing, and a quick run says
    nothing before its verdict. Lost for real, it is copied a timeout later, as always."""
    p = proc()
    p.on_command(cmd("jb", "b"), T0)
    p.punctuate(T0, 100)
    seen = {"default": T0 + 5 * TIMEOUT}
    t = T0 + 5 * TIMEOUT
    p.punctuate(t, 100, deadline_watermark=t, queue_watermark=lambda q: seen.get(q, 0))
    assert p.load("jb").active[f"jb@{T0}"].deadline_ms == T0 + TIMEOUT  # put off
    # B is back: its acks (of other runs, dispatched later) pass the deadline.
    t += TIMEOUT
    seen["b"] = t
    late = {"b": T0 + 1}  # B reached runs dispatched after this one

    def again(now: int) -> list[tuple[str, int]]:
        out, _ = p.punctuate(
            now,
            100,
            deadline_watermark=now,
            queue_watermark=lambda q: seen.get(q, 0),
            reached_by_queue=late,
            queue_acked=seen,
        )
        return [(r.job_id, r.attempt) for r in out.runs]

    assert again(t) == []
    run = p.load("jb").active[f"jb@{T0}"]
    assert (run.deadline_ms, run.due_ms) == (0, t + TIMEOUT)
    # A timeout later, B's acks past it and still no verdict: copied.
    t += TIMEOUT
    seen["b"] = t
    assert again(t) == [("jb", 2)]
