"""A broker outage longer than a transaction's timeout, mid-stream, on a broker of the test's own
(the session's broker is shared): afterwards every job runs, none is lost, and every partition
dispatches again without restarting anything. Meanwhile the scheduler's readiness says Kafka is
unreachable, and its liveness does not ask for a restart that would not help."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest

from jobwheel.deploy.broker import free_port
from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.models import State
from tests.conftest import settings_env, settings_on
from tests.integration.scheduler_support import (
    TopicTail,
    log_events,
    now_ms,
    start_scheduler,
)
from tests.support import DEMO_TASKS, start_worker, wait_until

OUTAGE_S = 60


@pytest.mark.timeout(420)
def test_every_job_runs_after_a_60s_broker_outage(own_broker, procs, tmp_path, figure):
    settings = settings_on(own_broker.bootstrap, tmp_path)
    env = settings_env(settings)
    start_worker(procs, env, tmp_path / "worker.log", tasks=DEMO_TASKS)
    metrics = f"http://127.0.0.1:{free_port()}"
    scheduler = start_scheduler(
        procs, env, tmp_path / "s", extra_env={"JOBWHEEL_METRICS_PORT": metrics.rsplit(":", 1)[1]}
    )

    def health(kind: str) -> tuple[int, dict[str, str]]:
        """The scheduler's /health/<kind>: status and the failing checks' details."""
        try:
            with urllib.request.urlopen(f"{metrics}/health/{kind}", timeout=10) as resp:
                code, body = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            code, body = exc.code, exc.read()
        failing = {c["check"]: c["detail"] for c in json.loads(body)["checks"] if not c["ok"]}
        return code, failing

    tail = TopicTail(settings)
    try:
        start = now_ms() + 2000
        jobs = [
            JobSpec(
                job_id=f"out-{i}",
                task="demo.echo",
                at=datetime.fromtimestamp((start + i * 250) / 1000, UTC),  # over 75 s
            )
            for i in range(300)
        ]
        with JobClient(settings) as client:
            job_ids = client.schedule_many(jobs)
        wait_until(lambda: len(tail.events(state=State.SUCCEEDED)) >= 20, 30, 0.2, "no runs")

        assert health("ready")[0] == 200
        own_broker.stop()
        stopped_at = now_ms()
        code, failing = wait_until(
            lambda: (h := health("ready"))[0] == 503 and "kafka" in h[1] and h,
            30,
            0.5,
            "readiness never said Kafka is unreachable",
        )
        assert failing["kafka"].startswith(f"cannot reach Kafka at {own_broker.bootstrap}")
        wait_until(lambda: now_ms() - stopped_at >= OUTAGE_S * 1000, OUTAGE_S + 5, 1.0)
        assert health("live")[0] == 200, health("live")  # a restart would not bring Kafka back
        own_broker.start()
        restarted_at = now_ms()
        wait_until(lambda: health("ready")[0] == 200, 150, 1.0, "never ready after the outage")

        wait_until(
            lambda: set(job_ids) <= {e.job_id for e in tail.events(state=State.SUCCEEDED)},
            150,
            1.0,
            "some jobs never ran after the outage",
        )
        wait_until(
            lambda: set(job_ids) <= {e.job_id for e in tail.events(state=State.COMPLETED)},
            60,
            1.0,
            "some jobs ran but never COMPLETED",
        )
        after = [r for r in tail.all_runs() if r.dispatched_at_ms >= restarted_at]
        assert {r.partition for r in after} == set(range(settings.partitions)), (
            "a partition did not dispatch again after the outage"
        )
        assert scheduler.poll() is None, "the scheduler died"
        aborts = len(
            log_events(scheduler.log_path, "transaction aborted; processing the batch again")
        )
        resets = len(
            log_events(scheduler.log_path, "dropping all partitions and rejoining the group")
        )
        latest = max(r.dispatched_at_ms - r.scheduled_time_ms for r in tail.all_runs())
        figure(
            f"[outage] broker down {OUTAGE_S} s: 300/300 jobs SUCCEEDED and COMPLETED; "
            f"every partition dispatched again; transactions aborted {aborts}, "
            f"scheduler resets {resets}; max fire lateness {latest} ms"
        )
    finally:
        tail.close()
