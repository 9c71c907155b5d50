"""The producer every part uses: config defaults and the delivery-callback bridge.

Callers deal in jobwheel's own errors (:class:`DeliveryError`, :class:`BrokerError`, each with
the librdkafka error name as ``.code``, from :mod:`jobwheel.kafka.errors`) and plain
:class:`Delivered` values, never in client objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as _Producer

from jobwheel.errors import BrokerConnectionError, BrokerError, DeliveryError
from jobwheel.kafka.config import Service
from jobwheel.kafka.errors import broker_error, delivery_error, with_client_logging
from jobwheel.settings import Settings

#: ``produce``'s partition when the partitioner chooses (librdkafka's RD_KAFKA_PARTITION_UA, the
#: client's own default). Records are produced with positional arguments, in confluent-kafka's
#: order: topic, value, key, partition, on_delivery, callback, timestamp (0: now), headers.
_ANY_PARTITION = -1

#: Defaults every jobwheel producer starts from; the producer's pass-through layers and then
#: the call's overrides replace any of them.
PRODUCER_DEFAULTS: dict[str, Any] = {
    # No duplicates or reordering from internal retries, and a record is only acknowledged
    # once all in-sync replicas have it: a scheduled job must not be lost after schedule()
    # returned.
    "enable.idempotence": True,
    "acks": "all",
    # The Java client's partitioner: the scheduler's partition for a job id is the same one.
    "partitioner": "murmur2_random",
    # Small batching window: schedule() waits for the ack, so keep the added latency low.
    "linger.ms": 5,
    # A broker that is down surfaces as a DeliveryError within 30 s instead of librdkafka's
    # 5-minute default, so a synchronous caller is not stuck.
    "message.timeout.ms": 30_000,
    "client.id": "jobwheel-producer",
    # Batches compressed: measured at 5,000 jobs/s end to end (BENCHMARKS.md), 5.4 times
    # fewer bytes on the broker's disk and on the wire (what replication multiplies), for the
    # same CPU per job in every process within the noise. The scheduler's transactional
    # producer takes the same setting. The scheduler's record-size limits are on the record
    # before compression; the broker's max.message.bytes on the compressed batch.
    "compression.type": "lz4",
}


def producer_config(
    settings: Settings, service: Service | None = None, **overrides: Any
) -> dict[str, Any]:
    """A confluent-kafka producer config: defaults, then the producer's pass-through layers
    (of ``service``, if one), then ``overrides``.

    librdkafka keys contain dots, so pass overrides as ``**{"linger.ms": 0}``.
    """
    return {**PRODUCER_DEFAULTS, **settings.librdkafka("producer", service), **overrides}


@dataclass(frozen=True, slots=True)
class Delivered:
    """Where the broker put an acknowledged record."""

    topic: str
    partition: int
    offset: int


#: ``callback(error, delivered)``: exactly one of them is None.
DeliveryCallback = Callable[[DeliveryError | None, Delivered | None], None]


class Producer:
    """A confluent-kafka producer that reports delivery with jobwheel errors.

    Safe to use from several threads (librdkafka is); a delivery callback runs on whichever
    thread is inside :meth:`poll`/:meth:`flush` when the report arrives, so callbacks must
    only record the outcome, not block.
    """

    def __init__(self, config: dict[str, Any], package: str = "jobwheel.producers") -> None:
        # Client-level errors (broker down, auth failed) are logged; records keep retrying
        # until their message.timeout.ms and then fail through their own delivery callbacks.
        config = with_client_logging(config, package)
        try:
            self._producer = _Producer(config)
        except KafkaException as exc:
            raise broker_error(exc, "invalid producer config") from exc

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: DeliveryCallback,
        *,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        queue_timeout_s: float = 30.0,
    ) -> None:
        """Queue one record; ``on_delivery`` runs from a later :meth:`poll`/:meth:`flush`.

        A full local queue is waited out (by polling) for up to ``queue_timeout_s``; errors
        detected before queueing (too large, unknown partition) raise :class:`DeliveryError`.
        """

        def report(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                on_delivery(delivery_error(err), None)
            else:
                on_delivery(None, Delivered(msg.topic(), msg.partition(), msg.offset()))

        where = _ANY_PARTITION if partition is None else partition
        deadline = time.monotonic() + queue_timeout_s
        while True:
            try:
                # Positional (see _ANY_PARTITION): confluent-kafka parses keyword arguments
                # at 2.3 us a call where positional ones take 1.0.
                self._producer.produce(topic, value, key, where, report, None, 0, headers or None)
                return
            except BufferError as exc:
                if time.monotonic() >= deadline:
                    raise DeliveryError(
                        "the local producer queue stayed full; the broker is slow or down "
                        "(raise queue.buffering.max.messages or slow down)",
                        code="_QUEUE_FULL",
                    ) from exc
                self._producer.poll(0.05)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError):
                    raise delivery_error(err) from exc
                raise DeliveryError(f"record not queued: {exc}") from exc

    def try_produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: DeliveryCallback,
        *,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> bool:
        """Queue one record without waiting; False if the local queue is full right now."""
        try:
            self.produce(topic, value, key, on_delivery, headers=headers, queue_timeout_s=0.0)
        except DeliveryError as exc:
            if exc.code == "_QUEUE_FULL":
                return False
            raise
        return True

    def check_topic(self, topic: str, timeout_s: float) -> None:
        """The broker answers a metadata request within ``timeout_s`` and ``topic`` exists;
        else :class:`BrokerConnectionError` / :class:`BrokerError`, one line each."""
        try:
            metadata = self._producer.list_topics(topic=topic, timeout=timeout_s)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else exc
            text = err.str() if isinstance(err, KafkaError) else str(err)
            raise BrokerConnectionError(
                f"Kafka did not answer within {timeout_s:g}s ({text})", code="_TIMED_OUT"
            ) from exc
        found = metadata.topics.get(topic)
        err = found.error if found is not None else None
        if found is None or (err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise BrokerError(
                f"topic {topic} does not exist on the broker: create the topics with "
                "`jobwheel topics ensure` (or check JOBWHEEL_TOPIC_PREFIX)",
                code="UNKNOWN_TOPIC_OR_PART",
            )
        if err is not None:  # e.g. TOPIC_AUTHORIZATION_FAILED: this principal may not use it
            raise BrokerError(f"topic {topic}: {err.str()} ({err.name()})", code=err.name())

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery callbacks; returns how many ran."""
        return int(self._producer.poll(timeout_s))

    def flush(self, timeout_s: float) -> int:
        """Wait for every queued record's delivery callback; returns how many are still queued."""
        return int(self._producer.flush(timeout_s))

    def __len__(self) -> int:
        return len(self._producer)

    def close(self, timeout_s: float = 10.0) -> int:
        """Flush what is queued (callbacks still run) and return how many were left behind."""
        return self.flush(timeout_s)

    def purge(self) -> None:
        """Drop every queued and in-flight record without waiting (before exiting without the
        interpreter's teardown: nothing is then left for librdkafka to wait on)."""
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)
