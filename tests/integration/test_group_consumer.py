"""The group member of the worker and the status sink, on the real broker: partitions whose
committed offsets were not fetched are assigned again, and start where they should.

librdkafka leaves newly assigned partitions waiting for good when the fetch of their committed
offsets fails as a whole with "Not coordinator" (librdkafka issue 5586; seen once in CI: a worker
whose partitions came back after a broker freeze never fetched one of them again). That failure
cannot be made to happen on demand: the coordinator has to move between the assignment and the
fetch. What is tested here is the answer to it, on a real consumer: the error is recognised, and
assigning the partitions again starts each at its committed offset (or the reset policy's, with
none), keeps a paused one paused, and leaves alone a partition that has given records.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from jobwheel.kafka.consumer import GroupConsumer, Record, offsets_not_fetched
from tests.support import scaled, wait_until

PER_PARTITION = 6


def _produce(settings: Any, topic: str, partitions: int) -> None:
    producer = Producer(settings.librdkafka())
    for p in range(partitions):
        for i in range(PER_PARTITION):
            producer.produce(topic, f"{p}-{i}".encode(), partition=p)
    assert producer.flush(scaled(30)) == 0


def _commit(settings: Any, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit for a group with no member yet (a simple commit)."""
    consumer = Consumer(settings.librdkafka(**{"group.id": group, "enable.auto.commit": False}))
    try:
        consumer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def test_the_not_coordinator_offset_fetch_failure_is_recognised() -> None:
    """The text librdkafka gives the failure (its code alone also answers a commit's failure,
    which librdkafka retries itself)."""
    failed = KafkaError(
        KafkaError.NOT_COORDINATOR,
        'Failed to fetch committed offsets for 0 partition(s) in group "g": Broker: Not '
        "coordinator",
    )
    assert offsets_not_fetched(failed)
    commit = KafkaError(KafkaError.NOT_COORDINATOR, "Commit failed: Broker: Not coordinator")
    assert not offsets_not_fetched(commit)
    other = KafkaError(
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        "Failed to fetch committed offsets: Broker: Coordinator load in progress",
    )
    assert not offsets_not_fetched(other)


@pytest.mark.parametrize(
    "protocol",
    [
        {"partition.assignment.strategy": "cooperative-sticky"},  # the default
        {"group.protocol": "consumer"},  # KIP-848, which an operator may choose
    ],
    ids=["classic", "consumer"],
)
def test_partitions_assigned_again_start_at_their_committed_offsets(
    settings: Any, caplog: pytest.LogCaptureFixture, protocol: dict[str, str]
) -> None:
    topic = settings.topics.acks
    group = f"{settings.worker_group}-reassign"
    _produce(settings, topic, settings.partitions)
    # Partition 0 and 1 have committed offsets; 2 has none (earliest applies); 3 is paused.
    _commit(settings, group, {(topic, 0): 2, (topic, 1): 4})
    consumer = GroupConsumer(
        settings.librdkafka(
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **protocol,
            }
        ),
        "jobwheel.kafka",
        "test consumer",
    )
    assigned: list[tuple[str, int]] = []
    seen: dict[int, list[int]] = {p: [] for p in range(settings.partitions)}

    def take(records: list[Record]) -> None:
        for r in records:
            seen[r.partition].append(r.offset)

    try:
        consumer.subscribe(
            [topic],
            on_assign=lambda pairs: (assigned.extend(pairs), consumer.pause([(topic, 3)])),
            on_revoke=lambda pairs: None,
            on_lost=lambda pairs: None,
        )
        wait_until(
            lambda: take(consumer.consume(100, 0.2)) or seen[0],
            scaled(60),
            0,
            "partition 0 never gave a record",
        )
        # Partition 0 has given records: it is fetching and is not assigned again. The others
        # are (those that gave records meanwhile are read from their committed offsets again:
        # nothing a caller has is skipped).
        with caplog.at_level(logging.WARNING, logger="jobwheel.kafka.consumer"):
            consumer._fetch_offsets_again()
        told = [r for r in caplog.records if "assigning them again" in r.getMessage()]
        assert told, caplog.text
        assert (topic, 0) not in told[0].partitions  # type: ignore[attr-defined]
        assert (topic, 3) in told[0].partitions  # type: ignore[attr-defined]
        assert not [r for r in caplog.records if "failed" in r.getMessage()], caplog.text
        expected = {0: 2, 1: 4, 2: 0}
        wait_until(
            lambda: (
                take(consumer.consume(100, 0.2))
                or all(len(set(seen[p])) == PER_PARTITION - start for p, start in expected.items())
            ),
            scaled(60),
            0,
            f"not every partition was read from its committed offset: {seen}",
        )
        for p, start in expected.items():
            assert min(seen[p]) == start, seen
            assert sorted(set(seen[p])) == list(range(start, PER_PARTITION)), seen
        # The paused partition stayed paused through it; resumed, it is read from the start.
        assert seen[3] == [], seen
        consumer.resume([(topic, 3)])
        wait_until(
            lambda: take(consumer.consume(100, 0.2)) or len(seen[3]) == PER_PARTITION,
            scaled(60),
            0,
            f"the paused partition was not read once resumed: {seen[3]}",
        )
        assert seen[3] == list(range(PER_PARTITION))
        assert sorted(assigned) == [(topic, p) for p in range(settings.partitions)]
    finally:
        consumer.close()
