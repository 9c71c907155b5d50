"""A worker whose runs consumer stops joining its group gets a new one, and its runs run again.

Seen in a loop of short broker restarts (2 runs in 10): the worker's consumer (classic
protocol) timed out its session while the broker was down, lost its partitions, and librdkafka
waited for ever for an offset commit sent during the outage before it would join again (join
state wait-incr-unassign-to-complete); runs waited and nothing said why. That cannot be had
on demand, so the test makes a consumer stop joining the way the worker can see it:
``JOBWHEEL_WORKER_FAULT_STOP_REJOINING`` has it leave the group for good once its partitions
are lost (a real session timeout, the broker stopped). What is checked is the worker's bound
on that state: no partition and no member id for three session timeouts with the broker
reachable, then a new consumer.

And the other way round: a worker in a group with more workers than partitions holds none
and keeps its consumer (it is a member, with a member id).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobwheel.consumers.worker.kafka import CONSUMER_DEFAULTS
from jobwheel.consumers.worker.pooling.core import (
    MEMBERSHIP_CHECK_S,
    MIN_OUTSIDE_S,
    OUTSIDE_SESSIONS,
)
from jobwheel.deploy.broker import LocalBroker
from jobwheel.schemas.models import State
from tests.conftest import settings_env, settings_on
from tests.integration.scheduler_support import (
    TopicTail,
    log_events,
    make_run,
    now_ms,
    produce_runs,
)
from tests.support import DEMO_TASKS, start_worker, wait_until

REPLACED = (
    "the runs consumer has not been in its group for a while with Kafka reachable; replacing it"
)
FAULT = "fault injection: the runs consumer leaves its group for good"
#: The worker's session timeout and its bound on a consumer out of its group.
SESSION_S = CONSUMER_DEFAULTS["session.timeout.ms"] / 1000
OUTSIDE_S = max(MIN_OUTSIDE_S, OUTSIDE_SESSIONS * SESSION_S)
#: Longer than the session timeout: the consumer's session times out and it loses its
#: partitions while the broker is down.
OUTAGE_S = SESSION_S + 6


def echo(settings: Any, n: int) -> Any:
    run = make_run(settings, "demo.echo", {"n": n})
    produce_runs(settings, [run])
    return run


@pytest.mark.timeout(240)
def test_a_worker_whose_consumer_stops_joining_gets_a_new_one(
    own_broker: LocalBroker, procs, tmp_path, figure
):
    settings = settings_on(own_broker.bootstrap, tmp_path)
    env = settings_env(settings)
    worker = start_worker(
        procs,
        env,
        tmp_path / "worker.log",
        tasks=DEMO_TASKS,
        log_format="json",
        worker_fault_stop_rejoining="true",
    )
    tail = TopicTail(settings)
    try:
        tail.wait_for(echo(settings, 1).run_id, State.SUCCEEDED, timeout_s=60)
        own_broker.stop()
        wait_until(
            lambda: log_events(worker.log_path, "partitions lost"),
            OUTAGE_S + 10,
            0.5,
            "the worker's session did not time out while the broker was down",
        )
        own_broker.start()
        back_at = now_ms()
        wait_until(
            lambda: log_events(worker.log_path, FAULT), 30, 0.5, "the fault was not injected"
        )
        after = echo(settings, 2)
        done = tail.wait_for(after.run_id, State.SUCCEEDED, timeout_s=OUTSIDE_S + 60)
        replaced = log_events(worker.log_path, REPLACED)
        assert len(replaced) == 1, replaced
        figure(
            f"[membership] consumer out of its group {replaced[0]['outside_s']} s with the "
            f"broker up, then replaced; a run produced after the outage SUCCEEDED "
            f"{(done[0].event_time_ms - back_at) / 1000:.1f} s after the broker was back"
        )
        assert worker.poll() is None, "the worker died"
    finally:
        tail.close()


@pytest.mark.timeout(180)
def test_a_worker_with_no_partition_to_hold_keeps_its_consumer(kafka_bootstrap, procs, tmp_path):
    settings = settings_on(kafka_bootstrap, tmp_path, partitions=1)
    env = settings_env(settings)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    workers = [start_worker(procs, env, log, tasks=DEMO_TASKS, log_format="json") for log in logs]
    tail = TopicTail(settings)
    try:
        tail.wait_for(echo(settings, 1).run_id, State.SUCCEEDED, timeout_s=60)
        wait_until(
            lambda: all(log_events(log, "worker started") for log in logs),
            30,
            0.5,
            "the workers did not start",
        )
        holders = [log for log in logs if log_events(log, "partitions assigned")]
        assert len(holders) == 1, "one worker holds the one partition, the other none"
        # Past the bound (and two checks more) for the worker with no partition.
        time.sleep(OUTSIDE_S + 3 * MEMBERSHIP_CHECK_S)
        assert not [e for log in logs for e in log_events(log, REPLACED)]
        assert all(w.poll() is None for w in workers), "a worker died"
        tail.wait_for(echo(settings, 2).run_id, State.SUCCEEDED, timeout_s=30)
    finally:
        tail.close()
