"""Where the SDK's reader starts by time (``JobClient.wait``, ``jobwheel dlq list --since``): a
record appended while it looks up the start is read, not skipped. ``wait`` looks up where the
job's events begin right after its command was sent; a scheduler that answers within that
lookup must not be missed (it was, once the scheduler got fast: a console test's ``wait`` timed
out with "its scheduling was never answered")."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Producer, TopicPartition

from jobwheel.kafka.consumer import Record
from jobwheel.kafka.reader import TopicReader
from tests.support import kafka_call


class _AppendAfterLookup:
    """The reader's own consumer, with one record produced to the partition right after its
    time lookup has answered: the race, made to happen every time."""

    def __init__(self, consumer: Any, settings: Any, topic: str) -> None:
        self._consumer = consumer
        self._settings = settings
        self._topic = topic
        self.appended: list[int] = []

    def offsets_for_times(self, partitions: Any, timeout: float) -> Any:
        found = self._consumer.offsets_for_times(partitions, timeout=timeout)
        producer = Producer(self._settings.librdkafka())

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.appended.append(msg.offset())

        producer.produce(self._topic, b"the answer", key=b"job", partition=0, on_delivery=delivered)
        assert producer.flush(10) == 0
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def test_a_record_appended_during_the_start_lookup_is_read(settings: Any) -> None:
    topic = settings.topics.status
    reader = TopicReader(settings, "tests", "reader-race")
    leader = TopicPartition(topic, 0)  # the topic is new: wait until its partition has a leader
    kafka_call(lambda: reader._consumer.get_watermark_offsets(leader, timeout=5), "end offset")
    racing = _AppendAfterLookup(reader._consumer, settings, topic)
    reader._consumer = racing
    try:
        since_ms = int(time.time() * 1000)
        start = reader.offsets_at(topic, [0], since_ms, 10.0)[0]
        assert racing.appended, "the record was not appended during the lookup"
        assert start <= racing.appended[0], "the reader would start past the appended record"
        reader.assign({(topic, 0): start})
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline and not seen:
            record = reader.poll(0.5)
            if isinstance(record, Record):
                seen.append(record.value)
        assert seen == [b"the answer"]
    finally:
        reader._consumer = racing._consumer
        reader.close()
