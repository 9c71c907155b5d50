"""Thin confluent-kafka wrappers for the worker: the runs consumer and the status producer.

The only module of the worker that imports ``confluent_kafka``. It turns ``KafkaException`` /
``KafkaError`` into :mod:`jobwheel.errors` (with the librdkafka code name) and messages into
plain :class:`Record` values, so the pool's logic never handles client objects.

Threading: a confluent-kafka consumer may be used from one thread at a time, and rebalance
callbacks run inside ``consume()`` on the calling thread. The pool therefore calls every
:class:`RunsConsumer` method from one dedicated thread. The producer is thread-safe; its delivery
callbacks are served by a small polling thread (see :class:`StatusProducer`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from jobwheel.errors import BrokerError, DeliveryError
from jobwheel.settings import Settings

log = logging.getLogger(__name__)
# librdkafka's own log lines, through logging (structured) instead of raw stderr.
_client_log = logging.getLogger("jobwheel.consumers.worker.librdkafka")


@dataclass(frozen=True, slots=True)
class Record:
    """One fetched runs record."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def _broker_error(exc: BaseException, what: str) -> BrokerError:
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    code = err.name() if err is not None else None
    return BrokerError(f"{what}: {err.str() if err is not None else exc}", code=code)


def _log_client_error(err: KafkaError) -> None:
    """Client-level trouble (broker unreachable, auth failure): librdkafka keeps retrying."""
    log.warning("kafka client error", extra={"code": err.name(), "error": err.str()})


#: Defaults the pass-through ``kafka_config`` may change.
CONSUMER_DEFAULTS: dict[str, Any] = {
    # A new group (or one whose offsets expired) starts at the oldest retained run rather than
    # skipping runs dispatched before the first worker joined. Replayed old attempts are
    # mostly dropped as STALE or deduplicated by event id; set "latest" to skip them instead.
    "auto.offset.reset": "earliest",
    # Only the partitions that move are revoked when workers join or leave; the others keep
    # executing and committing.
    "partition.assignment.strategy": "cooperative-sticky",
    "enable.partition.eof": False,
    # A dead worker's partitions move after the session timeout (librdkafka's default is 45 s);
    # 10 s matches the scheduler. Runs it held are redelivered by the next owner or, failing
    # that, by the scheduler's visibility timeout.
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 3_000,
    # Runs become visible when the scheduler's transaction commits; do not park a fetch for
    # librdkafka's default 500 ms when the broker has nothing yet.
    "fetch.wait.max.ms": 50,
}


def consumer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """The worker's consumer config: defaults, the pass-through ``kafka_config`` (SASL/TLS ...),
    then the keys the delivery guarantees depend on, which the pass-through cannot change:
    manual commits of finished work only (no auto commit, no auto offset store), and
    ``read_committed`` so runs of aborted scheduler transactions (a fenced owner's) never run.
    """
    required = {
        "group.id": settings.worker_group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
    }
    return {**CONSUMER_DEFAULTS, **settings.librdkafka(**required, **overrides)}


PartitionsCallback = Callable[[list[int]], None]


class RunsConsumer:
    """A consumer group member on one topic, speaking partitions as ints. One thread only."""

    def __init__(self, settings: Settings, topic: str, **overrides: Any) -> None:
        self.topic = topic
        config = consumer_config(settings, **overrides)
        config.setdefault("error_cb", _log_client_error)
        config.setdefault("logger", _client_log)
        try:
            self._consumer = Consumer(config)
        except KafkaException as exc:
            raise _broker_error(
                exc, "could not create the runs consumer; check kafka_config"
            ) from exc
        self._closed = False

    def subscribe(
        self,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        """Join the group. Callbacks get partition numbers; confluent-kafka applies the
        (incremental) assignment itself after ``on_assign`` returns."""

        def parts(tps: list[TopicPartition]) -> list[int]:
            return [tp.partition for tp in tps if tp.topic == self.topic]

        self._consumer.subscribe(
            [self.topic],
            on_assign=lambda _c, tps: on_assign(parts(tps)),
            on_revoke=lambda _c, tps: on_revoke(parts(tps)),
            on_lost=lambda _c, tps: on_lost(parts(tps)),
        )

    def consume(self, max_records: int, timeout_s: float) -> list[Record]:
        """Fetch up to ``max_records``; transient errors are logged, fatal ones raised."""
        try:
            messages = self._consumer.consume(max_records, timeout_s)
        except KafkaException as exc:
            raise _broker_error(exc, "consuming runs failed") from exc
        out: list[Record] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise BrokerError(f"consuming runs failed: {err.str()}", code=err.name())
                log.warning("consumer error", extra={"code": err.name(), "error": err.str()})
                continue
            partition, offset = msg.partition(), msg.offset()
            if partition is None or offset is None:
                continue
            out.append(Record(partition, offset, msg.key(), msg.value()))
        return out

    def commit(self, offsets: dict[int, int], *, asynchronous: bool) -> None:
        """Commit ``partition -> next offset to read``."""
        if not offsets:
            return
        tps = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=asynchronous)
        except KafkaException as exc:
            raise _broker_error(exc, f"committing offsets {offsets} failed") from exc

    def pause(self, partitions: list[int]) -> None:
        if partitions:
            self._consumer.pause([TopicPartition(self.topic, p) for p in partitions])

    def resume(self, partitions: list[int]) -> None:
        if partitions:
            self._consumer.resume([TopicPartition(self.topic, p) for p in partitions])

    def assignment(self) -> list[int]:
        return [tp.partition for tp in self._consumer.assignment() if tp.topic == self.topic]

    def lag(self) -> dict[int, int]:
        """Per assigned partition, records not fetched yet: the end offset as of the last
        fetch response minus the position (no request to the broker). A partition not
        fetched yet counts 0."""
        out: dict[int, int] = {}
        try:
            assigned = [tp for tp in self._consumer.assignment() if tp.topic == self.topic]
            for tp in self._consumer.position(assigned):
                _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
                known = high >= 0 and tp.offset >= 0
                out[tp.partition] = max(0, high - tp.offset) if known else 0
        except KafkaException as exc:
            log.debug("lag not sampled", extra={"error": str(exc)})
        return out

    def close(self) -> None:
        """Leave the group now (the revoke callback runs first), so partitions move at once."""
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()
        except KafkaException as exc:
            log.warning("closing the runs consumer failed", extra={"error": str(exc)})


#: ``on_delivery(error)`` of :meth:`StatusProducer.produce`: None once the broker has the record.
DeliveryReport = Callable[[DeliveryError | None], None]


class StatusProducer:
    """Produces the worker's events; each record's delivery report calls its ``on_delivery``.

    Uses ``jobwheel.producers.kafka.producer_config`` (idempotent, acks=all, murmur2 partitioner):
    the scheduler that owns a job's partition reads its acknowledgements from the same partition
    number of the acks topic, so the partitioner must be the one every other producer uses.

    Delivery reports are served by one polling thread of this object, and ``on_delivery`` runs
    there: it must be quick and thread-safe (the pool marks offsets done under its lock and
    hands anything else to its event loop in batches).
    """

    def __init__(self, settings: Settings, **overrides: Any) -> None:
        from jobwheel.producers.kafka import producer_config

        config = producer_config(settings, **overrides)
        config.setdefault("error_cb", _log_client_error)
        config.setdefault("logger", _client_log)
        try:
            self._producer = Producer(config)
        except KafkaException as exc:
            raise _broker_error(
                exc, "could not create the status producer; check kafka_config"
            ) from exc
        self._stop = threading.Event()
        self._poller = threading.Thread(
            target=self._poll_forever, name="jobwheel-status-poll", daemon=True
        )
        self._poller.start()

    def _poll_forever(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def produce(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: list[tuple[str, bytes]] | None,
        on_delivery: DeliveryReport,
    ) -> bool:
        """Hand a record to the producer; False (nothing queued) while its local queue is full.
        Records produced in call order are delivered in that order (idempotent producer)."""

        def report(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                on_delivery(None)
            else:
                on_delivery(
                    DeliveryError(f"status event not delivered: {err.str()}", code=err.name())
                )

        try:
            self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
        except BufferError:
            return False
        except KafkaException as exc:
            raise _broker_error(exc, "producing a status event failed") from exc
        return True

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding deliveries; returns how many are still undelivered."""
        return int(self._producer.flush(timeout_s))

    def close(self, timeout_s: float = 10.0) -> int:
        remaining = self.flush(timeout_s)
        self._stop.set()
        self._poller.join(timeout=1.0)
        return remaining
