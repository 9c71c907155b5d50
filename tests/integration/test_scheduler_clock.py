"""A client whose clock is wrong, on the real broker: the scheduler holds a command's issue
time to the broker's append time of its record (within JOBWHEEL_SCHEDULER_CLOCK_TOLERANCE_MS),
so a ``--now`` job from a client an hour fast runs now, not in an hour. And the scheduler's own
"now", held to the broker's time as read, is read from fresh records only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from jobwheel.clock import ManualClock
from jobwheel.deploy.broker import free_port
from jobwheel.producers.client import JobClient
from jobwheel.streams.metrics import PREFIX
from tests.integration.scheduler_support import (
    engine_of,
    job_in,
    log_events,
    now_ms,
    start_scheduler,
    step_until,
)
from tests.support import metric, scaled

HOUR = 3_600_000
MINUTE = 60_000


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


def test_the_last_record_of_a_quiet_partition_is_not_taken_for_the_brokers_time(settings, tail):
    """The scheduler's "now" is its host's clock held within bounds of the broker's time,
    which it reads from the append times of the records it reads at the end of their
    partition. Only a record appended while the scheduler waited at that end says what time
    it is now. A scheduler that starts (or claims a partition) reads the last record of a
    quiet partition at its end too, when its last owner died before committing past it; that
    record's time is as old as the partition is quiet. Taken for the broker's time, it held
    "now" back by that age less the ahead bound: runs fired then were dispatched that far in
    the past, their visibility deadlines expired that much early, and a second attempt ran
    them again (15 runs twice after a scheduler restart on the cluster, dispatched 40 s in
    the past). Here the scheduler starts a minute after the partition's last record was
    written; then a record is appended while it reads, and its time holds the host's clock,
    a minute ahead of the broker's, to the ahead bound."""
    p = 0
    visibility = timedelta(minutes=10)
    old = job_in(p, settings.partitions, "old")
    with JobClient(settings) as client:
        client.schedule(old, task="demo.echo", now=True, visibility_timeout=visibility)
    host = ManualClock(now_ms() + MINUTE)  # the scheduler's host, a minute after the record
    with engine_of(settings, host, held_to_broker=True) as engine:
        step_until(engine, lambda: tail.runs_of(old), "the old record's job never fired")
        [run] = tail.runs_of(old)
        assert run.dispatched_at_ms == host.now_ms(), "the old record was taken for the time"

        fresh = job_in(p, settings.partitions, "fresh")
        with JobClient(settings) as client:
            at = datetime.fromtimestamp(now_ms() / 1000, UTC)
            client.schedule(fresh, task="demo.echo", at=at, visibility_timeout=visibility)
        step_until(engine, lambda: tail.runs_of(fresh), "the fresh record's job never fired")
        [run] = tail.runs_of(fresh)
        ahead = settings.scheduler_clock_step_tolerance_ms
        assert run.dispatched_at_ms <= now_ms() + ahead < host.now_ms()
