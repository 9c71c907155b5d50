"""Retries and redeliveries as the status store aggregates them, from real event streams.

The store's own tests feed it synthetic events with made-up ids; here the events come from
the real processes: ``jobwheel scheduler``, ``jobwheel worker`` and ``jobwheel serve`` (the
sink and the API on the embedded store). The test talks to them only as a user does:
commands through the SDK, the job's state through the status API (which answers with
``jobwheel.consumers.status.queries``), and the broker's view of the worker group. Nothing here
reads a scheduler log line, so it holds for any scheduler that keeps the commands, topics and status
events.
"""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobwheel.producers.client import JobClient
from tests.stack_support import wait_for_api
from tests.support import Procs, file_lines, start_worker, stop, wait_for_group, wait_until


def _env(jobwheel_env: dict[str, str], tmp_path: Path, name: str) -> dict[str, str]:
    """Each process its own data dir (scheduler state, embedded store)."""
    return {**jobwheel_env, "JOBWHEEL_DATA_DIR": str(tmp_path / name)}


def _get(settings: Any, path: str) -> Any:
    try:
        with urllib.request.urlopen(f"{settings.status_api_url}{path}", timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _job(settings: Any, job_id: str) -> dict[str, Any] | None:
    """GET /jobs/{id}: the job row, its runs and its events in lifecycle order."""
    return _get(settings, f"/jobs/{job_id}")


def _job_in(settings: Any, job_id: str, state: str) -> dict[str, Any] | None:
    detail = _job(settings, job_id)
    return detail if detail is not None and detail["job"]["state"] == state else None


def _events(detail: dict[str, Any]) -> list[tuple[str, int | None]]:
    return [(e["state"], e["attempt"] or None) for e in detail["events"]]


@pytest.fixture
def pipeline(
    settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path
) -> dict[str, Any]:
    """Scheduler and status service running, API answering."""
    scheduler = procs.spawn(
        ["jobwheel", "scheduler"], _env(jobwheel_env, tmp_path, "scheduler"), tmp_path / "s.log"
    )
    serve_log = tmp_path / "serve.log"
    serve = procs.spawn(["jobwheel", "serve"], _env(jobwheel_env, tmp_path, "status"), serve_log)
    wait_for_api(settings.status_api_url, serve_log)
    return {"scheduler": scheduler, "serve": serve}


def _start_worker(procs: Procs, jobwheel_env: dict[str, str], tmp_path: Path, name: str) -> Any:
    env = _env(jobwheel_env, tmp_path, name)
    # A short session: the group notices a SIGKILLed member soon.
    env["JOBWHEEL_KAFKA_CONFIG"] = json.dumps({"session.timeout.ms": 6000})
    return start_worker(procs, env, tmp_path / f"{name}.log")


def test_a_flaky_run_shows_one_run_two_attempts_and_the_job_completed(
    settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path, pipeline: Any
) -> None:
    worker = _start_worker(procs, jobwheel_env, tmp_path, "worker")
    with JobClient(settings) as client:
        job_id = client.schedule(
            "flaky", task="demo.flaky", args={"failures": 1}, now=True, max_attempts=3
        )
    detail = wait_until(
        lambda: _job_in(settings, job_id, "COMPLETED"),
        120,
        interval_s=0.5,
        message=f"job never COMPLETED in the store: {_job(settings, job_id)}",
    )
    job, runs = detail["job"], detail["runs"]
    assert (job["task"], job["attempts"]) == ("demo.flaky", 2)
    # The job succeeded: it shows no error now; attempt 1's error stays on its FAILED event.
    assert job["last_error"] is None
    (failed,) = [e for e in detail["events"] if e["state"] == "FAILED"]
    assert failed["error"] == "RuntimeError: demo.flaky: attempt 1 fails (first 1 do)"
    assert job["next_fire_ms"] is None
    (run,) = runs
    assert run["run_id"] == job["last_run_id"]
    assert (run["state"], run["attempts"]) == ("SUCCEEDED", 2)
    assert run["worker"].endswith(f":{worker.pid}")
    assert run["finished_ms"] is not None and run["duration_ms"] is not None
    assert run["dispatched_ms"] >= run["scheduled_time_ms"]
    assert _events(detail) == [
        ("SCHEDULED", None),
        ("DISPATCHED", 1),
        ("STARTED", 1),
        ("FAILED", 1),
        ("RETRYING", 1),
        ("DISPATCHED", 2),
        ("STARTED", 2),
        ("SUCCEEDED", 2),
        ("COMPLETED", None),
    ]


def test_a_run_lost_with_its_worker_is_run_again_and_shows_as_one_run(
    settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path, pipeline: Any
) -> None:
    first = _start_worker(procs, jobwheel_env, tmp_path, "first")
    wait_for_group(settings, settings.worker_group, settings.topics.runs)
    started, gate = tmp_path / "started", tmp_path / "gate"
    with JobClient(settings) as client:
        job_id = client.schedule(
            "victim",
            task="test.gate",
            args={"gate": str(gate), "started": str(started)},
            now=True,
            visibility_timeout=timedelta(seconds=3),
            max_attempts=3,
        )

    def started_in_store() -> bool:
        detail = _job(settings, job_id)
        return detail is not None and ("STARTED", 1) in _events(detail)

    wait_until(started_in_store, 60, interval_s=0.5, message="the run never STARTED")
    assert file_lines(started)  # executing, blocked on its gate: it cannot have finished
    stop(first, signal.SIGKILL)
    gate.touch()
    second = _start_worker(procs, jobwheel_env, tmp_path, "second")
    detail = wait_until(
        lambda: _job_in(settings, job_id, "COMPLETED"),
        120,
        interval_s=0.5,
        message=f"job never COMPLETED in the store: {_job(settings, job_id)}",
    )
    # The next worker ran the unfinished attempt again (Kafka redelivered it: its offset was
    # never committed); the scheduler sent no second attempt into the silent partition.
    job = detail["job"]
    assert (job["task"], job["state"], job["attempts"]) == ("test.gate", "COMPLETED", 1)
    (run,) = detail["runs"]
    assert (run["state"], run["attempts"]) == ("SUCCEEDED", 1)
    assert run["worker"].endswith(f":{second.pid}")
    # Event ids are deterministic (run_id:attempt:STATE): attempt 1 started again on the second
    # worker is the same event, stored once.
    assert _events(detail) == [
        ("SCHEDULED", None),
        ("DISPATCHED", 1),
        ("STARTED", 1),
        ("SUCCEEDED", 1),
        ("COMPLETED", None),
    ]
    assert file_lines(started) == [f"{run['run_id']}:1"] * 2


def test_the_history_of_every_job_is_whole_after_the_scheduler_is_sigkilled_mid_stream(
    settings: Any,
    jobwheel_env: dict[str, str],
    procs: Procs,
    tmp_path: Path,
    pipeline: Any,
    figure: Any,
) -> None:
    """300 jobs due over six seconds; the scheduler is SIGKILLed while it fires them (its
    open transaction, status batches included, is aborted) and a new one takes over from the
    changelog. In the store each job then has its whole history: one SCHEDULED, its runs
    DISPATCHED and SUCCEEDED, one COMPLETED; no event lost with the aborted transaction and
    none doubled by the new owner's second go at the same inputs."""
    _start_worker(procs, jobwheel_env, tmp_path, "worker")
    wait_for_group(settings, settings.worker_group, settings.topics.runs)
    count = 300
    with JobClient(settings) as client:
        ids = client.schedule_many(
            {
                "job_id": f"kill-{i}",
                "task": "demo.echo",
                "args": {"i": i},
                "in_": timedelta(milliseconds=1000 + 20 * i),
            }
            for i in range(count)
        )
        client.flush()

    def completed() -> int:
        return int(_get(settings, "/jobs?state=COMPLETED&limit=1")["total"])

    # A positive fact first: some jobs finished through this scheduler and are in the store.
    wait_until(lambda: completed() >= 20, 60, interval_s=0.2, message="no job COMPLETED")
    pipeline["scheduler"].send_signal(signal.SIGKILL)
    pipeline["scheduler"].wait(10)
    before = completed()
    procs.spawn(
        ["jobwheel", "scheduler"], _env(jobwheel_env, tmp_path, "scheduler-2"), tmp_path / "s2.log"
    )
    wait_until(
        lambda: completed() == count,
        120,
        interval_s=0.5,
        message=f"not every job COMPLETED: {completed()} of {count}",
    )
    assert before < count, "every job had finished before the kill: nothing was tested"
    figure(f"scheduler SIGKILL: {before} of {count} jobs COMPLETED in the store at the kill")
    broken = {}
    for job_id in ids:
        detail = _job(settings, job_id)
        assert detail is not None, job_id
        states = [e["state"] for e in detail["events"]]
        runs = {e["attempt"] for e in detail["events"] if e["state"] == "DISPATCHED"}
        whole = (
            states.count("SCHEDULED") == 1
            and states.count("COMPLETED") == 1
            and runs
            and states.count("DISPATCHED") == len(runs)
            and states.count("SUCCEEDED") == 1
        )
        if not whole:
            broken[job_id] = states
    assert broken == {}, f"{len(broken)} broken histories, e.g. {list(broken.items())[:3]}"
