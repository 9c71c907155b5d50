"""A new changelog consumer, what the engine makes when a restore has stalled, carries on where
the old one was: no record read again, none skipped (a record skipped would be a job state
lost in the restore; read again, only time wasted, but it says the positions were not kept)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

from jobwheel.streams.kafka import ChangelogReader
from tests.support import wait_until

RECORDS = 150


def _read_until(reader: ChangelogReader, seen: dict[int, list[int]], done: Any, what: str) -> None:
    def step() -> bool:
        for p, offset, _key, _value in reader.poll_changes(20, 0.2):
            seen.setdefault(p, []).append(offset)
        return bool(done())

    wait_until(step, 30, 0.0, what)


def test_a_rebuilt_changelog_reader_goes_on_from_the_positions_reached(settings: Any) -> None:
    topic = settings.topics.changelog(settings.scheduler_app_id)
    producer = Producer(settings.librdkafka())
    for p in (0, 1):
        for i in range(RECORDS):
            producer.produce(topic, b"v", key=f"k{i}".encode(), partition=p)
    assert producer.flush(30) == 0
    reader = ChangelogReader(settings, "test-restore")
    try:
        seen: dict[int, list[int]] = {}
        reader.assign(0, -1)  # from the start
        # Partway through partition 0 (small polls: the rest stays unread).
        _read_until(reader, seen, lambda: len(seen.get(0, [])) >= 10, "nothing was read")
        assert len(seen[0]) < RECORDS, "all of partition 0 read before the rebuild"
        reader.assign(1, 100)  # assigned, nothing of it read yet: starts where it was assigned
        reader.rebuild()
        assert reader.assigned == {0, 1}
        _read_until(
            reader,
            seen,
            lambda: seen.get(0, [-1])[-1] == RECORDS - 1 and seen.get(1, [-1])[-1] == RECORDS - 1,
            f"the rebuilt reader did not read both partitions to their end: {seen}",
        )
        assert seen[0] == list(range(RECORDS))
        assert seen[1] == list(range(100, RECORDS))
    finally:
        reader.close()
