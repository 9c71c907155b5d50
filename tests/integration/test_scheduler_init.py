"""A scheduler that cannot register its transactional producer for long (its broker frozen)
goes on with a new producer rather than asking the same client for ever, and gets going once
the broker answers again. On a broker of the test's own (it is frozen)."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobwheel.deploy.broker import LocalBroker
from jobwheel.producers.client import JobClient, JobSpec
from tests.conftest import settings_env, settings_on
from tests.integration.scheduler_support import (
    TopicTail,
    log_events,
    start_scheduler,
)
from tests.support import Procs, log_tail, wait_until


@pytest.mark.timeout(300)
def test_a_producer_that_cannot_register_is_replaced_and_the_scheduler_starts(
    own_broker: LocalBroker, procs: Procs, tmp_path: Path
) -> None:
    settings = settings_on(
        own_broker.bootstrap, tmp_path, partitions=2, scheduler_init_fresh_after_ms=3_000
    )
    scheduler = start_scheduler(procs, settings_env(settings), tmp_path / "s", wait=False)
    # Frozen once the scheduler has found Kafka and taken its state directory (right before
    # it registers its producer): the first registration on a new broker creates the
    # transaction log, which takes seconds, so it cannot complete before this.
    lock = tmp_path / "s" / "scheduler" / settings.scheduler_app_id / "LOCK"
    wait_until(
        lock.exists, 60, 0.02, f"the scheduler never started:\n{log_tail(scheduler.log_path)}"
    )
    pid = own_broker.running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)

    def replaced() -> list[dict[str, Any]]:
        assert scheduler.poll() is None, log_tail(scheduler.log_path)
        return [
            e
            for e in log_events(
                scheduler.log_path, "cannot register the transactional producer; retrying"
            )
            if e.get("new_producer")
        ]

    wait_until(
        replaced, 60, 0.5, f"the producer was never replaced:\n{log_tail(scheduler.log_path)}"
    )
    os.kill(pid, signal.SIGCONT)
    tail = TopicTail(settings)
    try:
        with JobClient(settings) as client:
            client.schedule_many(
                [JobSpec(job_id=f"j{i}", task="demo.echo", at=datetime.now(UTC)) for i in range(4)]
            )
        tail.wait(
            lambda: {r.job_id for r in tail.all_runs()} >= {f"j{i}" for i in range(4)},
            120,
            f"the scheduler never fired after the broker came up:\n{log_tail(scheduler.log_path)}",
        )
        assert scheduler.poll() is None, log_tail(scheduler.log_path)
    finally:
        tail.close()
