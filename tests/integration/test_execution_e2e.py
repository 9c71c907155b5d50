"""At-least-once execution end to end: scheduler + worker processes on the real broker.

Retries with backoff, DEAD runs on the dead-letter topic, a run lost with a SIGKILLed worker run
again by the next one, heartbeats that keep a long run from being redelivered, unknown tasks.

Jobs are submitted only once the worker group owns every runs partition, so a visibility
timeout never runs out while a worker is still joining; runs that must outlive a deadline block
on a gate file (``tests.tasks``) that the test opens once they have.
"""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta

from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import State
from tests.integration.scheduler_support import start_scheduler
from tests.support import file_lines, log_tail, scaled, start_worker, wait_for_group, wait_until


def worker_ready(settings) -> None:
    """Runs sent from now on are fetched at once: the group owns every runs partition."""
    wait_for_group(settings, settings.worker_group, settings.topics.runs)


def test_retries_dead_runs_unknown_tasks_and_heartbeats(
    settings, jobwheel_env, procs, tmp_path, tail
):
    start_scheduler(procs, jobwheel_env, tmp_path / "s1")
    start_worker(procs, jobwheel_env, tmp_path / "w1.log", "--concurrency", "4")
    worker_ready(settings)
    gate = tmp_path / "long-gate"
    visibility_s = scaled(4)
    with JobClient(settings) as client:
        flaky = client.schedule(
            "flaky", task="demo.flaky", args={"failures": 2}, now=True, max_attempts=3
        )
        doomed = client.schedule("doomed", task="demo.fail", now=True, max_attempts=3)
        unknown = client.schedule("unknown", task="no.such.task", now=True, max_attempts=3)
        long_run = client.schedule(
            "long",
            task="test.gate_async",
            args={"gate": str(gate)},
            now=True,
            visibility_timeout=timedelta(seconds=visibility_s),
        )

    # Fails twice, then succeeds: three attempts of one run, the last SUCCEEDED.
    tail.wait(lambda: tail.events(flaky, State.SUCCEEDED), 60, "flaky job never SUCCEEDED")
    attempts = sorted(r.attempt for r in tail.runs_of(flaky))
    assert attempts == [1, 2, 3]
    assert len({r.run_id for r in tail.runs_of(flaky)}) == 1
    assert [e.attempt for e in tail.events(flaky, State.FAILED)] == [1, 2]
    assert len(tail.events(flaky, State.RETRYING)) == 2
    assert tail.events(flaky, State.SUCCEEDED)[0].attempt == 3
    tail.wait(lambda: tail.events(flaky, State.COMPLETED), 20, "one-shot job not COMPLETED")

    # Always fails: DEAD after max attempts, and the run is on the dead-letter topic.
    dead = tail.wait(lambda: tail.events(doomed, State.DEAD), 60, "failing job never DEAD")
    assert sorted(r.attempt for r in tail.runs_of(doomed)) == [1, 2, 3]
    assert "RuntimeError" in (dead[0].reason or "") + (dead[0].error or "")
    codec = default_codec()

    def dead_runs() -> dict:
        return {
            codec.decode(m.value()).job_id: codec.decode(m.value())
            for m in tail.dead
            if dict(m.headers() or []).get("jobwheel.kind") == b"dead-run"
        }

    dead_run = tail.wait(lambda: dead_runs().get(doomed), 20, "DEAD run not on the DLQ")
    assert (dead_run.job_id, dead_run.attempt) == (doomed, 3)

    # Unknown task: FAILED with a clear reason, not retried, DEAD.
    failed = tail.wait(lambda: tail.events(unknown, State.FAILED), 30, "unknown task not FAILED")
    text = f"{failed[0].error} {failed[0].reason}"
    assert "no.such.task" in text
    assert failed[0].retry_delay_ms is None
    tail.wait(lambda: tail.events(unknown, State.DEAD), 30, "unknown task run not DEAD")
    assert [r.attempt for r in tail.runs_of(unknown)] == [1]

    # A run that outlives its visibility timeout twice over is kept alive by heartbeats and
    # never redelivered: it runs until a heartbeat a whole timeout past its first deadline.
    (dispatched,) = tail.wait(
        lambda: tail.events(long_run, State.DISPATCHED), 30, "long run never DISPATCHED"
    )
    outlived = dispatched.deadline_ms + int(visibility_s * 1000)
    tail.wait(
        lambda: [e for e in tail.events(long_run, State.HEARTBEAT) if e.event_time_ms > outlived],
        60,
        "no heartbeat a visibility timeout past the first deadline",
    )
    gate.touch()
    tail.wait(lambda: tail.events(long_run, State.SUCCEEDED), 30, "long task never SUCCEEDED")
    tail.wait(lambda: tail.events(long_run, State.COMPLETED), 30, "long job not COMPLETED")
    # COMPLETED follows every earlier scheduler event of the job on its partition: a
    # redelivery would be among these.
    assert [e.attempt for e in tail.events(long_run, State.DISPATCHED)] == [1]
    assert [r.attempt for r in tail.runs_of(long_run)] == [1]


def test_a_run_lost_with_its_sigkilled_worker_is_run_by_the_next_worker_without_a_second_dispatch(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """The worker dies mid-run; its visibility timeout passes while no worker reads the
    partition. Nothing is dispatched into that silent partition: the next worker gets the
    unfinished run from Kafka (its offset was never committed), and its STARTED keeps the
    scheduler from sending a second attempt of the same work."""
    start_scheduler(procs, jobwheel_env, tmp_path / "s1")
    first = start_worker(procs, jobwheel_env, tmp_path / "w1.log", "--concurrency", "4")
    worker_ready(settings)
    started, gate = tmp_path / "started.txt", tmp_path / "gate"
    with JobClient(settings) as client:
        job = client.schedule(
            "victim",
            task="test.gate",
            args={"gate": str(gate), "started": str(started)},
            now=True,
            visibility_timeout=timedelta(seconds=3),
            max_attempts=3,
        )
    tail.wait(lambda: tail.events(job, State.STARTED), 60, "run never STARTED")
    [dispatched] = tail.runs_of(job)
    os.kill(first.pid, signal.SIGKILL)  # blocked on its gate: it cannot have finished
    first.wait(scaled(10))

    gate.touch()
    second = start_worker(procs, jobwheel_env, tmp_path / "w2.log", "--concurrency", "4")
    tail.wait(
        lambda: tail.events(job, State.SUCCEEDED),
        60,
        f"not SUCCEEDED:\n{log_tail(second.log_path)}",
    )
    wait_until(lambda: tail.events(job, State.COMPLETED), 20, 0.2, "job not COMPLETED")
    # The second worker started it only after the first one's deadline had passed (a quick
    # run reports its start in its verdict)...
    first = first_worker(tail, job)
    [verdict] = [e for e in tail.events(job, State.SUCCEEDED) if e.worker != first]
    assert (verdict.started_ms or verdict.event_time_ms) > dispatched.deadline_ms
    # ...and ran the same attempt again: one dispatch, two executions.
    assert [(r.run_id, r.attempt) for r in tail.runs_of(job)] == [(dispatched.run_id, 1)]
    assert file_lines(started) == [f"{dispatched.run_id}:1"] * 2


def first_worker(tail, job: str) -> str:
    return tail.events(job, State.STARTED)[0].worker


def test_a_burst_longer_than_its_visibility_timeout_is_worked_through_without_copies(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """Jobs due at the same instant fire in one punctuation and share their dispatch time. One
    worker running one at a time needs several visibility timeouts for them all: the runs still
    queued at their deadline are waited for, not copied, because the worker's reports on the
    first runs of the burst do not say it reached the rest. Before, each deadline copied every
    run still queued (a second attempt of each), as after a broker outage that delays a burst."""
    start_scheduler(procs, jobwheel_env, tmp_path / "s1")
    start_worker(procs, jobwheel_env, tmp_path / "w1.log", "--concurrency", "1")
    worker_ready(settings)
    visibility = timedelta(seconds=scaled(2))
    burst, each_s = 16, scaled(0.5)  # 8 s of work: four visibility timeouts
    at = datetime.now(UTC) + timedelta(seconds=scaled(3))
    with JobClient(settings) as client:
        jobs = client.schedule_many(
            JobSpec(
                job_id=f"burst-{i}",
                task="demo.sleep",
                args={"seconds": each_s},
                at=at,
                visibility_timeout=visibility,
            )
            for i in range(burst)
        )
    tail.wait(
        lambda: {e.job_id for e in tail.events(state=State.SUCCEEDED)} >= set(jobs),
        scaled(60),
        f"the burst did not finish:\n{log_tail(tmp_path / 'w1.log')}",
    )
    runs = [r for r in tail.all_runs() if r.job_id in jobs]
    assert len({r.dispatched_at_ms for r in runs if r.attempt == 1}) < burst  # shared times
    assert sorted((r.job_id, r.attempt) for r in runs) == sorted((j, 1) for j in jobs)
    assert all(e.attempt == 1 for e in tail.events(state=State.SUCCEEDED) if e.job_id in jobs)
