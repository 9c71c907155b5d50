"""The test helpers themselves: a reader that cannot read says so instead of answering "empty"."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support import HarnessError, consume, read_all


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
