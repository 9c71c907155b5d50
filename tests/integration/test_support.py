"""The test helpers themselves: a reader that cannot read says so instead of answering "empty"."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support import HarnessError, Tail, consume, read_all, scaled


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
