"""Results and dead letters on the real pipeline (scheduler, worker and status API processes).

A user's view: `client.wait` returns a one-off job's result; `jobwheel status` and the API show
it; a run that ended DEAD is listed by `jobwheel dlq list`, and after its task is fixed `jobwheel
dlq replay` makes the same run end SUCCEEDED, with an event saying it was a replay; a command
the scheduler rejected for a transient reason is replayed, one it would reject again is not.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from jobwheel.errors import JobFailedError
from jobwheel.producers import JobClient
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import JobCommand, Now, ScheduleJob
from jobwheel.schemas.partitioning import partition_for
from tests.stack_support import Stack, start_stack
from tests.support import Procs, scaled, wait_until


@pytest.fixture
def stack(settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path) -> Stack:
    return start_stack(settings, jobwheel_env, procs, tmp_path)


@pytest.mark.timeout(400)
def test_results_waiting_and_a_dead_run_replayed_after_its_task_is_fixed(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    broken = stack.tmp / "task-is-broken"
    broken.touch()
    with JobClient(stack.settings) as client:
        # client.wait returns the task's return value (demo.echo returns its kwargs)
        echo = client.schedule(task="demo.echo", args={"x": 1, "word": "ü"}, now=True)
        assert client.wait(echo, scaled(60)) == {"x": 1, "word": "ü"}

    # A client left on another partition count than the deployment's topics (the default 12
    # against these 4) still gets the answer: its job's events are where the topics' own count
    # puts them, and the partition its own count names is not there at all.
    topics_count = stack.settings.partitions
    client_count = 12
    assert topics_count != client_count
    moved = next(
        job_id
        for job_id in (f"counted-{i}" for i in range(1000))
        if partition_for(job_id, client_count) != partition_for(job_id, topics_count)
    )
    other = stack.settings.model_copy(update={"partitions": client_count})
    with JobClient(other) as client:
        client.schedule(moved, task="demo.echo", args={"counted": True}, now=True)
        with caplog.at_level(logging.WARNING, logger="jobwheel.producers.results"):
            assert client.wait(moved, scaled(60)) == {"counted": True}
    [said] = [r for r in caplog.records if r.name == "jobwheel.producers.results"]
    assert (
        getattr(said, "fix", "") == f"set JOBWHEEL_PARTITIONS={topics_count} where this client runs"
    )

    with JobClient(stack.settings) as client:
        # a run that fails without a retry left: DEAD; wait says so, naming the error
        job = client.schedule(
            task="test.switch", args={"fail_if": str(broken)}, now=True, max_attempts=1
        )
        with pytest.raises(JobFailedError) as failed:
            client.wait(job, scaled(60))
        assert failed.value.state == "DEAD" and "task-is-broken exists" in str(failed.value)
        # its one attempt was used up: said so, not "not retryable", and the error said once
        said = str(failed.value)
        assert "attempt 1 of 1 failed: " in said and "not retr" not in said, said
        assert said.count("task-is-broken exists") == 1, said
        assert failed.value.error is not None and "task-is-broken exists" in failed.value.error

    # the result is in `jobwheel status` and the API, the run by its own id
    stack.reaches(echo, "COMPLETED")
    assert 'result={"x": 1, "word": "ü"}' in stack.ok("status", echo)
    [run] = stack.get(f"/jobs/{echo}")["runs"]
    assert run["result"] == {"x": 1, "word": "ü"}
    one = stack.get(f"/runs/{run['run_id']}")
    assert one["run"]["state"] == "SUCCEEDED" and one["run"]["result"] == {"x": 1, "word": "ü"}
    assert [e["state"] for e in one["events"]][-1] == "SUCCEEDED"

    # the dead run is on the dead-letter topic
    listed = json.loads(stack.ok("dlq", "list", "--job", job, "--json"))["dead_letters"]
    [letter] = listed
    assert letter["kind"] == "dead-run" and letter["task"] == "test.switch"
    assert letter["replayed"] is None  # not replayed yet: no mark
    assert "task-is-broken exists" in letter["error"]
    dead_run = letter["run_id"]
    assert stack.get(f"/runs/{dead_run}")["run"]["state"] == "DEAD"
    assert json.loads(stack.ok("dlq", "list", "--task", "demo.echo", "--json")) == {
        "dead_letters": []
    }

    # fix the task, replay: a dry run sends nothing, the real one makes the same run succeed
    broken.unlink()
    dry = stack.ok("dlq", "replay", "--job", job, "--dry-run")
    assert "would replay" in dry and dead_run in dry
    assert stack.get(f"/runs/{dead_run}")["run"]["state"] == "DEAD"
    assert "replayed" in stack.ok("dlq", "replay", "--job", job, "--note", "switch fixed")

    def succeeded() -> dict[str, Any] | None:
        found = stack.get(f"/runs/{dead_run}")
        return found if found and found["run"]["state"] == "SUCCEEDED" else None

    replayed = wait_until(succeeded, 60, interval_s=0.3, message="the replayed run never succeeded")
    assert replayed["run"]["result"] == "ok" and replayed["run"]["attempts"] == 2
    [dispatch] = [e for e in replayed["events"] if e["state"] == "DISPATCHED" and e["attempt"] == 2]
    assert "replay of DEAD run" in dispatch["reason"] and "switch fixed" in dispatch["reason"]
    stack.reaches(job, "COMPLETED")

    # replaying again sends nothing: the run is not DEAD any more
    again = stack.cli("dlq", "replay", "--job", job)
    assert again.returncode == 0 and "skipped" in again.stdout and "SUCCEEDED now" in again.stdout
    # and `dlq list` marks the letter as dealt with, in its text and its JSON
    mark = "replayed already: the run is SUCCEEDED now, not DEAD"
    [letter] = json.loads(stack.ok("dlq", "list", "--job", job, "--json"))["dead_letters"]
    assert letter["replayed"] == mark
    listed_text = stack.cli("dlq", "list", "--job", job)
    assert listed_text.stdout.rstrip().endswith(f"[{mark}]"), listed_text.stdout
    assert "1 dead letters, 1 of them replayed already" in listed_text.stderr


@pytest.mark.timeout(300)
def test_rejected_commands_are_replayed_only_when_they_would_be_accepted_now(
    stack: Stack,
) -> None:
    from confluent_kafka import Producer

    settings = stack.settings
    codec = default_codec()
    producer = Producer(settings.librdkafka())
    misrouted = JobCommand("cmd-misrouted", "misrouted", _now(), ScheduleJob("demo.echo", Now()))
    invalid = JobCommand("cmd-invalid", "invalid", _now(), ScheduleJob("no such task!", Now()))
    right = partition_for("misrouted", settings.partitions)
    # a producer with the wrong partitioner: the scheduler of that partition rejects it
    producer.produce(
        settings.topics.requests,
        codec.encode(misrouted),
        b"misrouted",
        partition=(right + 1) % settings.partitions,
    )
    producer.produce(settings.topics.requests, codec.encode(invalid), b"invalid")
    assert producer.flush(scaled(30)) == 0

    def both_dead_lettered() -> list[dict[str, Any]] | None:
        out = json.loads(stack.ok("dlq", "list", "--kind", "request", "--json"))["dead_letters"]
        return out if len(out) == 2 else None

    letters = wait_until(both_dead_lettered, 60, interval_s=0.5, message="no dead letters")
    assert {d["job_id"] for d in letters} == {"misrouted", "invalid"}

    out = stack.ok("dlq", "replay", "--kind", "request")
    lines = {line.split()[2]: line for line in out.splitlines()}
    assert lines["job=misrouted"].startswith("replayed")
    assert lines["job=invalid"].startswith("skipped") and "would be rejected again" in out
    stack.reaches("misrouted", "COMPLETED")
    events = stack.get("/jobs/misrouted")["events"]
    scheduled = next(e for e in events if e["state"] == "SCHEDULED")
    assert "replayed from the dead-letter topic" in scheduled["reason"]
    assert stack.job("invalid") is None  # never a job


def _now() -> int:
    import time

    return time.time_ns() // 1_000_000
