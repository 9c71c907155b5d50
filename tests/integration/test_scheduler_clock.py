"""A client whose clock is wrong, on the real broker: the scheduler holds a command's issue
time to the broker's append time of its record (within JOBWHEEL_SCHEDULER_CLOCK_TOLERANCE_MS),
so a ``--now`` job from a client an hour fast runs now, not in an hour."""

from __future__ import annotations

from jobwheel.clock import ManualClock
from jobwheel.deploy.broker import free_port
from jobwheel.producers.client import JobClient
from jobwheel.streams.metrics import PREFIX
from tests.integration.scheduler_support import (
    log_events,
    now_ms,
    start_scheduler,
)
from tests.support import metric, scaled

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


def test_a_burst_from_a_skewed_client_is_counted_whole_and_logged_once(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """Each command of a client whose clock is off is clamped and counted, but the line saying
    so is written once per half minute with how many it stands for: a line per command took
    an eighth of the scheduler's time in a burst."""
    port = free_port()
    scheduler = start_scheduler(
        procs, jobwheel_env, tmp_path / "s", extra_env={"JOBWHEEL_METRICS_PORT": str(port)}
    )
    fast = ManualClock(now_ms() + HOUR)
    with JobClient(settings, clock=fast) as client:
        jobs = [client.schedule(f"skewed-{i}", task="demo.echo", now=True) for i in range(20)]
    tail.wait(lambda: all(tail.runs_of(job) for job in jobs), scaled(30), "not all ran now")
    base = f"http://127.0.0.1:{port}"
    assert metric(base, f"{PREFIX}issue_times_clamped_total") == 20
    lines = log_events(scheduler.log_path, "command issue time clamped to the broker's time")
    assert [line["commands"] for line in lines] == [1]
