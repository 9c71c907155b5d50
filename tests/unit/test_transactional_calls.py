"""Which timed-out transactional calls the scheduler resumes and which it gives up on at once.

librdkafka lets a timed-out call be resumed by calling it again. For
``send_offsets_to_transaction`` that is where the scheduler hung: a call resumed while the
broker was down and still pending when it came back never returned (librdkafka issues 5456 and
5511; the broker-restart test saw it at 3 of 4 outages with the resume, at none of 12 without).
So that call is never resumed: its first timeout replaces the producer (a reset). A commit or
an abort goes to the transaction coordinator alone and is resumed as before."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from jobwheel.errors import FencedError
from jobwheel.settings import Settings
from jobwheel.streams.kafka import TransactionalProducer


def _timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out", retriable=True))


class _Client:
    """librdkafka's producer as far as a commit goes: each call fails with a retriable timeout
    as often as told, then succeeds."""

    def __init__(self, send_offsets_timeouts: int = 0, commit_timeouts: int = 0) -> None:
        self.calls: list[str] = []
        self._left = {"send_offsets": send_offsets_timeouts, "commit": commit_timeouts}

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self._left[name] > 0:
            self._left[name] -= 1
            raise _timed_out()

    def send_offsets_to_transaction(self, *_args: Any) -> None:
        self._call("send_offsets")

    def commit_transaction(self, *_args: Any) -> None:
        self._call("commit")

    def poll(self, *_args: Any) -> int:
        return 0


@pytest.fixture
def producer() -> Any:
    settings = Settings(_env_file=None, bootstrap_servers="127.0.0.1:1")  # type: ignore[call-arg]
    made = TransactionalProducer(settings, "jw-test-txn")
    yield made
    made.watchdog.close()


OFFSETS = [("jw.requests", 0, 10, "")]


def test_a_timed_out_send_offsets_is_not_resumed_but_replaces_the_producer(producer) -> None:
    producer._producer = client = _Client(send_offsets_timeouts=1)
    with pytest.raises(FencedError, match="send_offsets_to_transaction did not complete"):
        producer.commit(OFFSETS, group_metadata=None)
    assert client.calls == ["send_offsets"]


def test_a_timed_out_commit_is_resumed(producer) -> None:
    producer._producer = client = _Client(commit_timeouts=1)
    producer.commit(OFFSETS, group_metadata=None)
    assert client.calls == ["send_offsets", "commit", "commit"]
