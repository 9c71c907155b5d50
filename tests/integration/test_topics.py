"""``ensure_topics`` / ``jobwheel topics ensure`` against a real broker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from jobwheel.errors import TopicMismatchError
from jobwheel.kafka.admin import ensure_topics
from tests.support import scaled


def _partition_counts(settings) -> dict[str, int]:
    admin = AdminClient(settings.librdkafka())
    topics = admin.list_topics(timeout=10).topics
    return {
        spec.name: len(topics[spec.name].partitions)
        for spec in settings.topics.specs()
        if spec.name in topics
    }


def test_fixture_created_every_topic_with_the_configured_partitions(settings):
    counts = _partition_counts(settings)
    # The co-partitioned topics have the configured count; the workers roster, read whole by
    # every reader, has one.
    wanted = {spec.name: 4 for spec in settings.topics.specs()}
    wanted[settings.topics.workers] = 1
    assert counts == wanted


def test_ensure_is_idempotent(settings):
    assert ensure_topics(settings) == []
    assert ensure_topics(settings) == []


def test_ensure_creates_missing_topics_with_their_config(settings):
    fresh = settings.model_copy(update={"topic_prefix": settings.topic_prefix + "x"})
    created = ensure_topics(fresh)
    assert sorted(created) == sorted(s.name for s in fresh.topics.specs())
    admin = AdminClient(fresh.librdkafka())
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, fresh.topics.dead_letter)
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["retention.ms"].value == str(30 * 24 * 3600 * 1000)
    # The scheduler reads how far it got in the acks topic from broker append times.
    resource = ConfigResource(ConfigResource.Type.TOPIC, fresh.topics.acks)
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["message.timestamp.type"].value == "LogAppendTime"


def test_partition_mismatch_is_refused_with_what_to_do(settings):
    wrong = settings.model_copy(update={"topic_prefix": settings.topic_prefix + "w"})
    admin = AdminClient(wrong.librdkafka())
    admin.create_topics([NewTopic(wrong.topics.runs, 2, 1)])[wrong.topics.runs].result(10)

    with pytest.raises(TopicMismatchError) as info:
        ensure_topics(wrong)

    message = str(info.value)
    assert wrong.topics.runs in message
    assert "has 2 partitions" in message and "expects 4" in message
    assert "JOBWHEEL_PARTITIONS=2" in message
    # Nothing else was created: the mismatch is reported before any change.
    assert set(admin.list_topics(timeout=10).topics) & {s.name for s in wrong.topics.specs()} == {
        wrong.topics.runs
    }


def test_cli_topics_ensure(settings, jobwheel_env):
    """The count is of the topics created: the prefix's and the scheduler's changelog (named
    by its application id). Counting the prefix's alone printed "5" after 6 "created" lines."""
    fresh_prefix = settings.topic_prefix + "c"
    fresh_app = settings.scheduler_app_id + "c"
    env = {
        **jobwheel_env,
        "JOBWHEEL_TOPIC_PREFIX": fresh_prefix,
        "JOBWHEEL_SCHEDULER_APP_ID": fresh_app,
    }
    cmd = [sys.executable, "-m", "jobwheel.cli", "topics", "ensure"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert f"created {fresh_prefix}.requests" in first.stdout
    assert f"created {fresh_app}-jobs-changelog" in first.stdout
    made = sum(line.startswith("created ") for line in first.stdout.splitlines())
    assert f"{made} topics, all created now (prefix {fresh_prefix}, " in first.stdout, first.stdout
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert "created" not in second.stdout
    assert f"{made} topics, all there already" in second.stdout, second.stdout


def test_cli_topics_ensure_mismatch_exits_nonzero(settings, jobwheel_env):
    env = {**jobwheel_env, "JOBWHEEL_PARTITIONS": "3"}
    cmd = [sys.executable, "-m", "jobwheel.cli", "topics", "ensure"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "JOBWHEEL_PARTITIONS=4" in proc.stderr


_OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
_TOPIC_TABLE = "| topic | `cleanup.policy` | `retention.ms` | timestamps |"
_DURATIONS_MS = {"day": 24 * 3600 * 1000, "days": 24 * 3600 * 1000, "h": 3600 * 1000}
_SIZES = {"MiB": 1024 * 1024}


def _operations_topic_table() -> list[list[str]]:
    """The rows of docs/operations.md's table of topic configs: the one place an operator
    reads them, so the test takes the promise from there instead of a copy of it."""
    text = _OPERATIONS.read_text(encoding="utf-8")
    at = text.find(_TOPIC_TABLE)
    assert at >= 0, f"docs/operations.md lost the table headed {_TOPIC_TABLE!r}"
    rows = []
    for line in text[at:].split("\n\n")[0].splitlines()[2:]:
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _amount(text: str, units: dict[str, int]) -> str:
    number, unit = text.split()
    return str(int(number) * units[unit])


def test_the_broker_holds_the_topic_configs_operations_md_states(settings):
    """Every topic the fixture made through ``ensure_topics`` (what ``jobwheel up`` and each
    scheduler run), read back from the broker, has the policy, retention, segment setting
    and timestamp type docs/operations.md states. The changelog must be compacted: a
    deleting one would lose every job older than its retention on the next restore."""
    from confluent_kafka.admin import ConfigResource

    names = {
        f"`<prefix>.{t.split('.', 1)[1]}`": t
        for t in (spec.name for spec in settings.topics.specs())
    }
    names["`<app id>-jobs-changelog`"] = settings.topics.changelog(settings.scheduler_app_id)
    rows = _operations_topic_table()
    assert sorted(r[0] for r in rows) == sorted(names), "the table and the topics differ"

    admin = AdminClient(settings.librdkafka())
    resources = {r[0]: ConfigResource(ConfigResource.Type.TOPIC, names[r[0]]) for r in rows}
    answers = admin.describe_configs(list(resources.values()))
    for doc_name, policy_cell, retention_cell, timestamps_cell in rows:
        config = answers[resources[doc_name]].result(timeout=scaled(10))
        policy = re.fullmatch(r"(\S+)(?: \(`(\S+)` (\d+ \S+)\))?", policy_cell)
        assert policy is not None, f"unreadable policy cell {policy_cell!r}"
        assert config["cleanup.policy"].value == policy.group(1), doc_name
        if policy.group(2):
            units = _SIZES if policy.group(2).endswith("bytes") else _DURATIONS_MS
            wanted = _amount(policy.group(3), units)
            assert config[policy.group(2)].value == wanted, (doc_name, policy.group(2))
        if retention_cell.startswith("none"):
            # Compaction alone: nothing is deleted by age.
            assert "delete" not in config["cleanup.policy"].value.split(","), doc_name
        tombstones = re.search(r"`delete\.retention\.ms`, (\d+ \S+)\)", retention_cell)
        if tombstones:  # how long a deletion stays readable (the scheduler's stale-state bound)
            wanted = _amount(tombstones.group(1), _DURATIONS_MS)
            assert config["delete.retention.ms"].value == wanted, doc_name
        else:
            wanted = _amount(retention_cell.split(" (")[0], _DURATIONS_MS)
            assert config["retention.ms"].value == wanted, doc_name
        stamp = "LogAppendTime" if timestamps_cell.startswith("`LogAppendTime`") else "CreateTime"
        assert config["message.timestamp.type"].value == stamp, doc_name
