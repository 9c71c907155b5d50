"""The test helpers themselves: a reader that cannot read says so instead of answering "empty"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support import (
    KAFKA_41_CONFIG,
    KAFKA_IMAGE,
    HarnessError,
    Tail,
    consume,
    kafka_version_shortfall,
    read_all,
    require_kafka_version,
    scaled,
    wait_until,
)


def test_read_all_returns_exactly_what_is_on_the_topic(settings: Any) -> None:
    topic = settings.topics.requests
    assert read_all(settings, topic) == []
    producer = Producer(settings.librdkafka())
    for p in range(settings.partitions):
        producer.produce(topic, value=f"record {p}".encode(), partition=p)
    assert producer.flush(30) == 0
    # The first call's markers are on the topic too, but they are not the topic's records.
    assert sorted(m.value() for m in read_all(settings, topic)) == [
        f"record {p}".encode() for p in range(settings.partitions)
    ]


def test_readers_raise_for_a_topic_that_does_not_exist(settings: Any) -> None:
    missing = settings.topics.requests + "-missing"
    with pytest.raises(HarnessError, match="not found"):
        read_all(settings, missing, timeout_s=2)
    with pytest.raises(HarnessError, match="not found"):
        consume(settings, missing, min_count=1, timeout_s=2)


def _transactional(settings: Any) -> Any:
    producer = Producer(
        settings.librdkafka(**{"transactional.id": f"{settings.topic_prefix}-test-tx"})
    )
    producer.init_transactions(scaled(30))
    return producer


def test_the_tail_reads_to_the_ends_past_aborted_records_and_commit_markers(
    settings: Any,
) -> None:
    """``read_to_end`` returns once it has read everything up to the ends taken at the call:
    a transaction's commit marker (the last offset of a partition) and an aborted
    transaction's records do not leave it waiting, and only committed records are read."""
    topic = settings.topics.requests
    producer = _transactional(settings)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted", partition=0)
    producer.abort_transaction(scaled(30))
    producer.begin_transaction()
    for p in range(settings.partitions):
        producer.produce(topic, value=f"committed {p}".encode(), partition=p)
    producer.commit_transaction(scaled(30))
    tail = Tail(settings, [topic])
    try:
        seen: list[bytes] = []
        tail.read_to_end(lambda m: seen.append(m.value()))
        assert sorted(seen) == [f"committed {p}".encode() for p in range(settings.partitions)]
        assert tail.behind(tail.end_offsets()) == {}
    finally:
        tail.close()


def test_the_scheduler_tail_refuses_to_pass_for_empty(settings: Any) -> None:
    """A negative check over the four topics cannot pass on a reader that saw nothing or
    broke: "no duplicates" over no runs at all raises, and so does every accessor once the
    reader cannot read a topic any more (here: it was deleted under it)."""
    from confluent_kafka.admin import AdminClient

    from tests.integration.scheduler_support import TopicTail

    tail = TopicTail(settings)
    try:
        tail.read_to_end()
        assert tail.all_runs() == []  # nothing was sent: the reader did read to the ends
        with pytest.raises(HarnessError, match="no run was read at all"):
            tail.duplicate_dispatches()
        admin = AdminClient(settings.librdkafka())
        for future in admin.delete_topics([settings.topics.runs]).values():
            future.result(scaled(30))
        with pytest.raises(HarnessError):
            tail.read_to_end(timeout_s=5)
        with pytest.raises(HarnessError, match="the topic reader failed"):
            tail.all_runs()
    finally:
        tail.close()


def test_the_session_broker_is_the_kafka_the_suite_needs(kafka_bootstrap: str) -> None:
    """The version check every session makes passes on this broker (Kafka 4.1 from
    deploy/lib here), and names what gives away an older one."""
    require_kafka_version(kafka_bootstrap)
    assert kafka_version_shortfall({KAFKA_41_CONFIG}) is None
    # testcontainers' default image (Confluent 7.6, Kafka 3.6) still has the 3.x setting.
    old = kafka_version_shortfall({"inter.broker.protocol.version", KAFKA_41_CONFIG})
    assert old is not None and "Kafka 3.x" in old
    assert "lacks group.streams" in (kafka_version_shortfall({"log.dirs"}) or "")


def test_the_container_runs_the_local_brokers_kraft_settings() -> None:
    """The Docker path cannot run here (no registry), so what it would run is checked: the
    apache/kafka 4.1.1 image, with every setting of the local broker's server.properties,
    only the listeners and the log directory changed for the container."""
    from jobwheel.deploy.broker import server_properties
    from tests.conftest import container_env

    assert KAFKA_IMAGE == "apache/kafka:4.1.1"
    local = dict(
        line.split("=", 1)
        for line in server_properties(port=5, controller_port=6, log_dirs=Path("/d")).splitlines()
        if "=" in line and not line.startswith("#")
    )
    env = container_env(5)
    assert {k: v for k, v in env.items() if k.endswith(("LISTENERS", "VOTERS", "LOG_DIRS"))} == {
        "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
        "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://127.0.0.1:5",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",
    }
    same = {k: v for k, v in local.items() if k not in ("listeners", "advertised.listeners")}
    same = {k: v for k, v in same.items() if k not in ("controller.quorum.voters", "log.dirs")}
    assert {f"KAFKA_{k.upper().replace('.', '_')}": v for k, v in same.items()}.items() <= (
        env.items()
    )
    assert env["KAFKA_GROUP_CONSUMER_SESSION_TIMEOUT_MS"] == "10000"  # KIP-848 groups' settings


def test_the_tail_reads_a_topic_deleted_and_created_again_from_its_new_beginning(
    settings: Any,
) -> None:
    """A tail whose topic is deleted and created again reads the new topic from its first
    record. Its read position is lost with the topic; a reset to the end (librdkafka's
    default) would skip whatever was written before the reader found the new topic, and a
    test waiting for those records would wait in vain."""
    from confluent_kafka.admin import AdminClient

    from jobwheel.kafka.admin import ensure_topics

    topic = settings.topics.acks
    tail = Tail(settings, [topic])
    try:
        tail.poll()
        admin = AdminClient(settings.librdkafka())
        for future in admin.delete_topics([topic], operation_timeout=30).values():
            future.result(scaled(30))
        # The reader looks for its partitions while the topic is gone.
        for _ in range(10):
            tail.poll(timeout_s=0.1)
        ensure_topics(settings)
        producer = Producer(settings.librdkafka())
        for p in range(settings.partitions):
            producer.produce(topic, value=f"after {p}".encode(), partition=p)
        assert producer.flush(30) == 0
        seen: list[bytes] = []
        wait_until(
            lambda: seen.extend(m.value() for m in tail.poll()) or len(seen) == settings.partitions,
            30,
            message="the tail did not read the records of the topic created again",
        )
        assert sorted(seen) == sorted(f"after {p}".encode() for p in range(settings.partitions))
    finally:
        tail.close()
