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

from jobwheel.deploy.stack import jobwheel
from jobwheel.kafka.admin import describe_group
from tests.support import scaled, wait_until


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
