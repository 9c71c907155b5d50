"""A client whose clock is wrong, on the real broker: the scheduler holds a command's issue
time to the broker's append time of its record (within JOBWHEEL_SCHEDULER_CLOCK_TOLERANCE_MS),
so a ``--now`` job from a client an hour fast runs now, not in an hour."""

from __future__ import annotations

from jobwheel.clock import ManualClock
from jobwheel.producers.client import JobClient
from tests.integration.scheduler_support import (
    log_events,
    now_ms,
    start_scheduler,
)
from tests.support import scaled

HOUR = 3_600_000


def test_a_now_job_from_a_client_an_hour_fast_runs_now(
    settings, jobwheel_env, procs, tmp_path, tail
):
    scheduler = start_scheduler(procs, jobwheel_env, tmp_path / "s")
    fast = ManualClock(now_ms() + HOUR)
    with JobClient(settings, clock=fast) as client:
        job = client.schedule("skewed-now", task="demo.echo", now=True)
    sent = now_ms()
    tail.wait(lambda: tail.runs_of(job), scaled(30), "the job was not run now")
    [run] = tail.runs_of(job)
    tolerance = settings.scheduler_clock_tolerance_ms
    assert run.scheduled_time_ms <= sent + tolerance
    [clamped] = log_events(scheduler.log_path, "command issue time clamped to the broker's time")
    assert clamped["skew_ms"] > HOUR - scaled(30) * 1000
