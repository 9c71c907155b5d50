"""The Kafka pass-through per role on the real broker: the README's static-membership tip, once
written into the common config every process reads, must not make schedulers fence each
other."""

from __future__ import annotations

import json

import pytest

from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.models import State
from tests.integration.scheduler_support import (
    log_events,
    start_scheduler,
)
from tests.support import DEMO_TASKS, start_worker, wait_for_group


@pytest.mark.timeout(300)
def test_two_schedulers_with_a_static_member_id_in_the_common_config_share_the_work(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """``group.instance.id`` in JOBWHEEL_KAFKA_CONFIG (the static-membership tip, given to the
    whole stack): before, both schedulers joined their group as the same static member and
    fenced each other in a loop. Now each scheduler ignores it (one warning line): both are
    members at once, every partition owned, and every job runs once."""
    common = {**settings.kafka_config, "group.instance.id": "worker-0"}
    env = {**jobwheel_env, "JOBWHEEL_KAFKA_CONFIG": json.dumps(common)}
    a = start_scheduler(procs, env, tmp_path / "a")
    b = start_scheduler(procs, env, tmp_path / "b", wait=False)
    owners = wait_for_group(
        settings, settings.scheduler_app_id, settings.topics.requests, 90, members=2
    )
    assert all(owners.values()), f"a member owns nothing: {owners}"
    start_worker(procs, env, tmp_path / "worker.log", tasks=DEMO_TASKS)
    with JobClient(settings) as client:
        jobs = client.schedule_many(
            [JobSpec(job_id=f"static-{i}", task="demo.echo", now=True) for i in range(40)]
        )
    tail.wait(
        lambda: set(jobs) <= {e.job_id for e in tail.events(state=State.COMPLETED)},
        90,
        "not every job COMPLETED",
    )
    assert tail.duplicate_dispatches() == {}
    assert all(len(tail.runs_of(j)) == 1 for j in jobs)
    assert a.poll() is None and b.poll() is None
    for proc in (a, b):
        assert log_events(
            proc.log_path,
            "group.instance.id in the Kafka consumer config is ignored by the scheduler",
        )
    # Still both members, after the work: no fencing loop took one of them out meanwhile.
    wait_for_group(settings, settings.scheduler_app_id, settings.topics.requests, 30, members=2)
