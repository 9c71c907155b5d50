"""The Python processes jobwheel starts itself (the services of ``jobwheel up``, the group
probe of ``jobwheel health``) import the installed jobwheel wherever they are started from:
``python -m`` puts the working folder first on the import path, and a folder named
``jobwheel`` there (a data dir, as in ``~/.local/share``) used to take the package's name in
an editable install (``make setup``'s)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from jobwheel.deploy.stack import jobwheel, worker_service
from jobwheel.kafka.admin import describe_group
from tests.support import log_tail, scaled, wait_for_log, wait_until


@pytest.fixture
def shadowing_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working folder: it holds a ``jobwheel`` folder laid out as a data dir is."""
    for part in ("kafka", "logs", "state"):
        (tmp_path / "jobwheel" / part).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_stacks_services_start_from_a_folder_that_holds_a_jobwheel_folder(
    shadowing_folder: Path,
) -> None:
    # A command that imports jobwheel.kafka, as every service does (ImportError before:
    # "cannot import name 'config' from 'jobwheel.kafka' (unknown location)").
    done = subprocess.run(  # in the fixture's working folder
        jobwheel("topics", "--help"), capture_output=True, text=True, timeout=scaled(60)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "topics" in done.stdout


def test_the_group_probe_answers_from_a_folder_that_holds_a_jobwheel_folder(
    settings: Any, shadowing_folder: Path
) -> None:
    """Before: "No module named jobwheel.kafka.groupprobe", and `jobwheel health` said FAIL
    for the workers of a stack whose workers were up."""
    from confluent_kafka import Consumer

    member = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": settings.worker_group,
            "client.id": "probe-test-member",
        }
    )
    member.subscribe([settings.topics.runs])
    seen: list[Any] = []

    def described() -> bool:
        member.poll(0.2)  # joins, and keeps its membership
        seen[:] = [describe_group(settings, settings.worker_group, scaled(15))]
        return any(m.client_id == "probe-test-member" for m in seen[0][1])

    try:
        wait_until(described, 60, 0.2, "the probe never saw the group's member")
    finally:
        member.close()
    state, _members = seen[0]
    assert state.upper() == "STABLE", state


def test_the_stacks_worker_imports_tasks_modules_from_the_folder_it_was_started_in(
    jobwheel_env: dict[str, str], procs: Any, shadowing_folder: Path
) -> None:
    """``jobwheel up --tasks my_tasks`` with ``my_tasks.py`` beside the user: ``-P`` keeps the
    working folder off the import path, and the service puts it back itself, after the
    installed packages (so the ``jobwheel`` folder there still shadows nothing)."""
    (shadowing_folder / "my_tasks.py").write_text(
        "from jobwheel.consumers.worker import task\n\n"
        "@task('mine.hello')\n"
        "def hello() -> str:\n"
        "    return 'hello'\n"
    )
    log_path = shadowing_folder / "worker.log"
    proc = procs.spawn(list(worker_service("my_tasks").argv), jobwheel_env, log_path)
    started = wait_for_log(log_path, "worker started", 60, proc=proc)
    line = next(x for x in started.splitlines() if "worker started" in x)
    assert "mine.hello" in line, log_tail(log_path)
