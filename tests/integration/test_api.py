"""The status API on the real broker: accepted commands land on the requests topic, status
events produced to the status topic come back out of GET /jobs through the in-process sink."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from jobwheel.consumers.status.api import create_app
from jobwheel.consumers.status.sink import StatusSink
from jobwheel.consumers.status.store import StatusStore
from jobwheel.producers.client import JobClient
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import (
    After,
    CancelJob,
    Cron,
    Every,
    JobCommand,
    PauseJob,
    ResumeJob,
    ScheduleJob,
    State,
    TriggerJob,
)
from jobwheel.schemas.partitioning import key_for
from jobwheel.settings import Settings
from tests.status_support import event, now_ms, produce
from tests.support import consume, wait_until


@pytest.fixture
def api(settings: Settings, store: StatusStore) -> Iterator[TestClient]:
    sink = StatusSink(settings, store, batch_ms=50)
    app = create_app(settings, store, sink=sink)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _commands(settings: Settings, count: int) -> list[tuple[bytes, JobCommand]]:
    messages = consume(settings, settings.topics.requests, min_count=count, timeout_s=30)
    codec = default_codec()
    out = [(m.key(), codec.decode(m.value())) for m in messages]
    return sorted(out, key=lambda kc: kc[1].issued_at_ms)  # type: ignore[union-attr]


def test_schedule_puts_a_validated_command_on_the_requests_topic(
    settings: Settings, api: TestClient
) -> None:
    bodies: list[dict[str, Any]] = [
        {"task": "demo.echo", "job_id": "api-in", "in": "5s", "args": {"x": 1}},
        {"task": "demo.echo", "job_id": "api-cron", "cron": "30 2 * * *", "tz": "Europe/Berlin"},
        {"task": "demo.sleep", "every": 1500, "max_attempts": 5, "timeout": "10s"},
    ]
    ids = []
    for body in bodies:
        r = api.post("/jobs", json=body)
        assert r.status_code == 202, r.text
        assert r.json()["command"] == "schedule" and r.json()["command_id"]
        ids.append(r.json()["job_id"])
    assert ids[:2] == ["api-in", "api-cron"] and len(ids[2]) == 32

    commands = {cmd.job_id: (key, cmd) for key, cmd in _commands(settings, 3)}
    assert set(commands) == set(ids)
    key, cmd = commands["api-in"]
    assert key == key_for("api-in")
    assert isinstance(cmd.body, ScheduleJob)
    assert (cmd.body.task, cmd.body.trigger) == ("demo.echo", After(5000))
    assert json.loads(cmd.body.args_json) == {"x": 1}
    assert commands["api-cron"][1].body.trigger == Cron("30 2 * * *", "Europe/Berlin")
    every = commands[ids[2]][1].body
    assert isinstance(every, ScheduleJob) and isinstance(every.trigger, Every)
    assert (every.trigger.interval_ms, every.max_attempts, every.timeout_ms) == (1500, 5, 10_000)


def test_control_commands(settings: Settings, api: TestClient) -> None:
    expected = {"cancel": CancelJob, "pause": PauseJob, "resume": ResumeJob, "trigger": TriggerJob}
    for kind in expected:
        r = api.post(f"/jobs/ctl-1/{kind}", json={"reason": f"because {kind}"})
        assert r.status_code == 202, r.text
        assert r.json()["job_id"] == "ctl-1" and r.json()["command"] == kind
    assert api.post("/jobs/ctl-1/pause").status_code == 202  # the body is optional
    commands = _commands(settings, 5)
    assert [type(c.body) for _, c in commands] == [*expected.values(), PauseJob]
    assert [c.body.reason for _, c in commands][:4] == [f"because {k}" for k in expected]
    assert {key for key, _ in commands} == {key_for("ctl-1")}


def test_status_events_flow_through_the_in_process_sink(
    settings: Settings, api: TestClient
) -> None:
    t0 = now_ms()
    run = f"flow@{t0}"
    produce(
        settings,
        [
            event(
                "flow",
                State.SCHEDULED,
                seq=1,
                t=t0,
                task="demo.echo",
                next_fire_ms=t0,
                queue="reports",
            ),  # fmt: skip
            event(
                "flow",
                State.DISPATCHED,
                seq=2,
                t=t0 + 3,
                run_id=run,
                attempt=1,
                scheduled_time_ms=t0,
                task="demo.echo",
                queue="reports",
            ),
            event(
                "flow",
                State.STARTED,
                seq=2,
                t=t0 + 4,
                run_id=run,
                attempt=1,
                worker="w",
                queue="reports",
            ),  # fmt: skip
            event("other", State.SCHEDULED, seq=1, t=t0, task="demo.echo", queue="default"),
        ],
    )
    body = wait_until(
        lambda: (
            (r := api.get("/jobs/flow")).status_code == 200
            and [x["state"] for x in r.json()["runs"]] == ["STARTED"]
            and r.json()
        ),
        30,
        message="the run never reached STARTED",
    )
    assert body["job"]["state"] == "SCHEDULED"  # the job's own state; STARTED is its run's
    assert body["runs"][0]["lateness_ms"] == 3
    # by queue (status_event.v4): the job and its run name their pool, and the list filters
    assert (body["job"]["queue"], body["runs"][0]["queue"]) == ("reports", "reports")
    listed = api.get("/jobs", params={"queue": "reports"}).json()
    assert [j["job_id"] for j in listed["jobs"]] == ["flow"] and listed["total"] == 1
    wait_until(
        lambda: [j["job_id"] for j in api.get("/jobs?queue=default").json()["jobs"]] == ["other"],
        30,
        message="the job on the default queue was never listed under it",
    )
    assert api.get("/jobs?queue=bad%20name").status_code == 422
    health = wait_until(
        lambda: (h := api.get("/health").json())["sink"]["inserted"] == 4 and h,
        10,
        message="the sink's counters never showed the insert",
    )
    assert health["status"] == "ok" and health["sink"]["running"] is True


def test_unreachable_broker_is_503_with_a_reason(settings: Settings, store: StatusStore) -> None:
    from jobwheel.deploy.broker import free_port

    dead = settings.model_copy(update={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    app = create_app(
        dead,
        store,
        job_client_factory=lambda: JobClient(
            dead, delivery_timeout_s=10, producer_overrides={"message.timeout.ms": 1500}
        ),
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.post("/jobs", json={"task": "demo.echo", "now": True})
    assert r.status_code == 503
    assert "Kafka did not confirm" in r.json()["detail"]
