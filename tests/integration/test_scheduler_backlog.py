"""A scheduler behind its input lets its transactions grow to the backlog commit interval
(``JOBWHEEL_SCHEDULER_BACKLOG_COMMIT_INTERVAL_MS``), on the real broker: each commit blocks the
loop for broker round trips, and committing every short interval while 80,000 commands of a
burst waited let the jobs due first fire seconds late."""

from __future__ import annotations

from datetime import timedelta

from jobwheel.deploy.broker import free_port
from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.models import State
from jobwheel.streams.metrics import PREFIX
from tests.integration.scheduler_support import start_scheduler
from tests.support import metric, scaled

JOBS = 3000
BATCH = 100


def test_a_backlog_of_commands_is_taken_in_few_transactions(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """With a commit after every poll when caught up (interval 0) and polls of 100 records,
    3,000 commands waiting when the scheduler starts are taken in a handful of transactions,
    not one per poll (30 or more)."""
    with JobClient(settings) as client:
        client.schedule_many(
            JobSpec(task="demo.echo", job_id=f"backlog-{i}", in_=timedelta(hours=1))
            for i in range(JOBS)
        )
    port = free_port()
    start_scheduler(
        procs,
        jobwheel_env,
        tmp_path / "s",
        extra_env={
            "JOBWHEEL_METRICS_PORT": str(port),
            "JOBWHEEL_SCHEDULER_MAX_BATCH": str(BATCH),
            "JOBWHEEL_SCHEDULER_COMMIT_INTERVAL_MS": "0",
            "JOBWHEEL_SCHEDULER_BACKLOG_COMMIT_INTERVAL_MS": "5000",
        },
    )
    tail.wait(
        lambda: len({e.job_id for e in tail.events(state=State.SCHEDULED)}) >= JOBS,
        scaled(60),
        "not every command was taken",
    )
    transactions = metric(f"http://127.0.0.1:{port}", f"{PREFIX}transactions_total")
    assert 1 <= transactions <= 10, f"{transactions:.0f} transactions for {JOBS} commands"
