"""A consumer that reads partitions it picks itself, from an offset or a time, without group
membership or commits: the SDK's ``wait`` (one job's events) and the dead-letter listing."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from jobwheel.errors import BrokerError
from jobwheel.kafka.consumer import Record
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

    def partitions(self, topic: str, timeout_s: float) -> list[int] | None:
        """The topic's partitions, or None when the broker does not have it."""
        try:
            meta = self._consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise BrokerError(f"cannot read the topic {topic}: {exc}") from exc
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        return sorted(meta.partitions)

    def end_offset(self, topic: str, partition: int, timeout_s: float = 10.0) -> int:
        """The offset the next record of the partition will get."""
        try:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )
        except KafkaException as exc:
            raise BrokerError(f"cannot read the end of {topic}/{partition}: {exc}") from exc
        return int(high)

    def offsets_at(
        self, topic: str, partitions: list[int], ms: int, timeout_s: float
    ) -> dict[int, int]:
        """Per partition, the first offset at or after ``ms``; where there is none, the end as
        it was *before* the lookup. Asked after it, the end can already be past a record
        appended in between (an answer to the command a caller has just sent: ``wait`` then
        never saw the job's events, a race that a fast scheduler made likely)."""
        ends = {p: self.end_offset(topic, p, timeout_s) for p in partitions}
        try:
            found = self._consumer.offsets_for_times(
                [TopicPartition(topic, p, max(0, ms)) for p in partitions], timeout=timeout_s
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
