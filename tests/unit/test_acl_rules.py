"""What each Kafka role may do (pure; tests/integration/test_kafka_acls.py proves it on a
real SASL broker), and the secure broker's properties."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwheel.deploy.acls import ROLES, role_grants, username
from jobwheel.deploy.broker import merge_properties, secure_overrides, server_properties
from jobwheel.errors import ConfigError
from jobwheel.settings import Settings

SETTINGS = Settings(_env_file=None, topic_prefix="jw", scheduler_app_id="jw-sched")  # type: ignore[call-arg]


def _rights(role: str) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for g in role_grants(SETTINGS, role):
        out.setdefault((g.resource, g.name + ("*" if g.prefixed else "")), set()).update(
            g.operations
        )
    return out


def _writes(role: str) -> set[str]:
    return {
        name for (kind, name), ops in _rights(role).items() if kind == "TOPIC" and "WRITE" in ops
    }


def test_each_role_writes_only_its_topics() -> None:
    assert _writes("submitter") == {"jw.requests"}
    assert _writes("worker") == {"jw.acks", "jw.workers"}
    assert _writes("sink") == set()
    assert _writes("api") == {"jw.requests"}
    assert _writes("scheduler") == {
        "jw.runs",
        "jw.status",
        "jw.dead-letter",
        "jw-sched-*",
    }


def test_the_workers_roster_is_written_by_workers_and_read_by_who_submits() -> None:
    """Workers announce their tasks there; submit, the SDK and the API read it to warn about
    a task no live worker serves."""
    for role in ("submitter", "api"):
        assert _rights(role)[("TOPIC", "jw.workers")] == {"READ", "DESCRIBE"}
    assert _rights("worker")[("TOPIC", "jw.workers")] == {"WRITE", "DESCRIBE"}
    # the scheduler only sees that it exists (its check of every topic at start)
    assert _rights("scheduler")[("TOPIC", "jw.workers")] == {"DESCRIBE"}


def test_no_role_administers_the_cluster() -> None:
    for role in ROLES:
        for (kind, name), ops in _rights(role).items():
            assert kind in ("TOPIC", "GROUP", "TRANSACTIONAL_ID")
            if (role, kind, name) == ("scheduler", "GROUP", SETTINGS.scheduler_app_id):
                # The scheduler sets its own group's session timing (KIP-848 group configs).
                ops = ops - {"ALTER_CONFIGS", "DESCRIBE_CONFIGS"}
            assert ops <= {"READ", "WRITE", "DESCRIBE"}, (role, ops)


def test_groups_and_transactional_ids() -> None:
    assert _rights("worker")[("GROUP", SETTINGS.worker_group)] == {"READ", "DESCRIBE"}
    assert _rights("sink")[("GROUP", SETTINGS.status_group)] == {"READ", "DESCRIBE"}
    assert _rights("scheduler")[("TRANSACTIONAL_ID", "jw-sched*")] == {"WRITE", "DESCRIBE"}
    assert all(kind != "TRANSACTIONAL_ID" for kind, _ in _rights("worker"))


def test_principals_are_per_prefix_and_role() -> None:
    assert username(SETTINGS, "worker") == "jw-worker"
    with pytest.raises(ConfigError, match="unknown role"):
        role_grants(SETTINGS, "root")


def test_secure_properties_keep_the_base_and_replace_the_listeners(tmp_path: Path) -> None:
    base = server_properties(port=9092, controller_port=9093, log_dirs=tmp_path)
    merged = merge_properties(
        base, secure_overrides(port=9092, controller_port=9093, admin_password="pw")
    )
    props = dict(
        line.split("=", 1) for line in merged.splitlines() if line and not line.startswith("#")
    )
    for line in base.splitlines():  # every base setting is still there (or overridden)
        if line and not line.startswith("#"):
            assert line.split("=", 1)[0] in props
    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert "PLAINTEXT:PLAINTEXT" not in props["listener.security.protocol.map"]
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin"
    assert len(merged.splitlines()) == len(set(merged.splitlines()))
