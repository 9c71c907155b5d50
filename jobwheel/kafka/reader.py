"""A consumer that reads partitions it picks itself, from an offset or a time, without group
membership or commits: the SDK's ``wait`` (one job's events) and the dead-letter listing."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from jobwheel.errors import BrokerError
from jobwheel.kafka.consumer import Record, ask_leaders, ask_watermarks
from jobwheel.kafka.errors import broker_error, with_client_logging
from jobwheel.settings import Settings

#: :meth:`TopicReader.assign`'s offset for "the partition's first retained record".
BEGINNING = OFFSET_BEGINNING


@dataclass(frozen=True, slots=True)
class PartitionEnd:
    """:meth:`TopicReader.poll` reached the end of a partition (``eof=True`` readers only)."""

    topic: str
    partition: int


class TopicReader:
    """Reads committed records only (``read_committed``); one thread at a time."""

    def __init__(self, settings: Settings, package: str, purpose: str, *, eof: bool = False):
        config = settings.librdkafka(
            "consumer",
            **{
                # a group id is required, but nothing is ever committed under it
                "group.id": f"jobwheel-{purpose}-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.partition.eof": eof,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            },
        )
        try:
            self._consumer = Consumer(with_client_logging(config, package))
        except KafkaException as exc:
            raise broker_error(exc, f"could not create the {purpose} reader") from exc

    def partitions(self, topic: str, timeout_s: float, *, strict: bool = False) -> list[int] | None:
        """The topic's partitions, or None when the broker does not have it. ``strict``: an
        error other than "no such topic" (not authorized to read it ...) raises
        :class:`BrokerError` instead of reading as a missing topic."""
        try:
            meta = self._consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise BrokerError(f"cannot read the topic {topic}: {exc}") from exc
        if (
            strict
            and meta is not None
            and meta.error is not None
            and meta.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            raise BrokerError(
                f"cannot read the topic {topic}: {meta.error.str()}", code=meta.error.name()
            )
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        return sorted(meta.partitions)

    def end_offset(self, topic: str, partition: int, timeout_s: float = 10.0) -> int:
        """The offset the next record of the partition will get."""
        return self.watermarks(topic, partition, timeout_s)[1]

    def watermarks(self, topic: str, partition: int, timeout_s: float = 10.0) -> tuple[int, int]:
        """The partition's first retained offset and the offset its next record will get."""
        try:
            return ask_watermarks(self._consumer, topic, partition, timeout_s)
        except KafkaException as exc:
            raise BrokerError(f"cannot read the end of {topic}/{partition}: {exc}") from exc

    def offsets_at(
        self, topic: str, partitions: list[int], ms: int, timeout_s: float
    ) -> dict[int, int]:
        """Per partition, the first offset at or after ``ms``; where there is none, the end as
        it was *before* the lookup. Asked after it, the end can already be past a record
        appended in between (an answer to the command a caller has just sent: ``wait`` then
        never saw the job's events, a race that a fast scheduler made likely)."""
        ends = {p: self.end_offset(topic, p, timeout_s) for p in partitions}
        at = [TopicPartition(topic, p, max(0, ms)) for p in partitions]
        try:
            found = ask_leaders(
                self._consumer,
                topic,
                timeout_s,
                lambda wait: self._consumer.offsets_for_times(at, timeout=wait),
            )
        except KafkaException as exc:
            raise BrokerError(f"cannot find where to read {topic}: {exc}") from exc
        return {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}

    def assign(self, offsets: dict[tuple[str, int], int]) -> None:
        """Read ``(topic, partition)`` from each offset (or :data:`BEGINNING`)."""
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in offsets.items()])

    def poll(self, timeout_s: float) -> Record | PartitionEnd | None:
        """The next record, a partition's end (``eof`` readers), or None; a fatal client error
        raises, other errors are skipped (librdkafka recovers from them)."""
        msg = self._consumer.poll(timeout_s)
        if msg is None:
            return None
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return PartitionEnd(msg.topic(), msg.partition())
            if error.fatal():
                raise BrokerError(f"reading {msg.topic()} failed: {error.str()}")
            return None
        return Record(
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.key(),
            msg.value(),
            msg.headers(),
            msg.timestamp()[1],
        )

    def close(self) -> None:
        self._consumer.close()


def read_table(
    settings: Settings, topic: str, package: str, purpose: str, timeout_s: float
) -> dict[bytes, bytes] | None:
    """A compacted topic as a table: each key's latest value, read from the beginning to the
    end offsets taken first (a tombstone removes its key; records without a key are skipped).
    None when the broker does not have the topic. Raises :class:`BrokerError` when the end is
    not reached within ``timeout_s``: a table read part-way would look like rows missing."""
    deadline = time.monotonic() + timeout_s
    reader = TopicReader(settings, package, purpose)
    try:
        parts = reader.partitions(topic, timeout_s, strict=True)
        if parts is None:
            return None
        marks = {p: _watermarks(reader, topic, p, deadline) for p in parts}
        ends = {p: end for p, (_low, end) in marks.items()}
        # The offset to reach per partition; an empty one is there already. Offsets of a
        # compacted partition have gaps, so "reached" is a record at or past end - 1.
        waiting = {p for p, (low, end) in marks.items() if end > low}
        reader.assign({(topic, p): BEGINNING for p in waiting})
        table: dict[bytes, bytes] = {}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrokerError(
                    f"reading {topic} to its end took over {timeout_s:g}s (partitions "
                    f"{sorted(waiting)} not read to offsets {[ends[p] for p in sorted(waiting)]})"
                )
            got = reader.poll(min(0.2, left))
            if not isinstance(got, Record):
                continue
            if got.key is not None:
                if got.value is None:
                    table.pop(got.key, None)
                else:
                    table[got.key] = got.value
            if got.offset >= ends.get(got.partition, 0) - 1:
                waiting.discard(got.partition)
        return table
    finally:
        reader.close()


def _watermarks(
    reader: TopicReader, topic: str, partition: int, deadline: float
) -> tuple[int, int]:
    """:meth:`TopicReader.watermarks`, asked again through a broker's transient answers (a
    topic created a moment ago has no leader in every broker's metadata yet) until
    ``deadline`` (monotonic)."""
    while True:
        try:
            return reader.watermarks(topic, partition, max(0.1, deadline - time.monotonic()))
        except BrokerError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
