"""The worker's Kafka clients: the runs consumer and the status producer, built on the shared
plumbing of :mod:`jobwheel.kafka` (group consumer, producer, configs, error translation). The
pool deals in partition numbers and plain :class:`Record` values, never in client objects.

Threading: a confluent-kafka consumer may be used from one thread at a time, and rebalance
callbacks run inside ``consume()`` on the calling thread. The pool therefore calls every
:class:`RunsConsumer` method from one dedicated thread. The producer is thread-safe; its delivery
callbacks are served by a small polling thread (see :class:`StatusProducer`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobwheel.errors import BrokerError, DeliveryError
from jobwheel.kafka.consumer import GroupConsumer, Record, committing_consumer_config
from jobwheel.kafka.producer import Producer, producer_config
from jobwheel.kafka.reader import PartitionEnd, TopicReader
from jobwheel.settings import Settings

log = logging.getLogger(__name__)
#: The worker's clients log librdkafka's lines as ``jobwheel.consumers.worker.librdkafka``.
_PACKAGE = "jobwheel.consumers.worker"


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


def consumer_config(
    settings: Settings, group: str | None = None, **overrides: Any
) -> dict[str, Any]:
    """The worker's consumer config: defaults, the pass-through ``kafka_config`` (SASL/TLS ...),
    then the keys the delivery guarantees depend on, which the pass-through cannot change:
    manual commits of finished work only (no auto commit, no auto offset store), and
    ``read_committed`` so runs of aborted scheduler transactions (a fenced owner's) never run.
    ``group``: the queue's group (:meth:`Settings.worker_group_for`), else the default one.
    """
    return committing_consumer_config(
        settings, group or settings.worker_group, CONSUMER_DEFAULTS, "worker", **overrides
    )


PartitionsCallback = Callable[[list[int]], None]

#: How long a synchronous offset commit, or reading the committed offsets, may take before the
#: worker gives up on it. A reachable broker answers in milliseconds; librdkafka itself would
#: wait for as long as the broker is down.
COMMIT_TIMEOUT_S = 10.0
#: Between two reads of the committed offsets while a synchronous commit is confirmed.
_CONFIRM_SLICE_S = 0.01


class RunsConsumer:
    """A consumer group member on one topic, speaking partitions as ints. One thread only."""

    def __init__(
        self, settings: Settings, topic: str, group: str | None = None, **overrides: Any
    ) -> None:
        self.topic = topic
        config = consumer_config(settings, group, **overrides)
        # KIP-848 (group.protocol=consumer): the broker's group.consumer.session.timeout.ms,
        # 45 s by default.
        self._session_timeout_ms = int(config.get("session.timeout.ms", 45_000))
        self._group = GroupConsumer(config, _PACKAGE, "runs consumer")

    def _parts(self, pairs: list[tuple[str, int]]) -> list[int]:
        return [p for t, p in pairs if t == self.topic]

    def subscribe(
        self,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        """Join the group. Callbacks get partition numbers; confluent-kafka applies the
        (incremental) assignment itself after ``on_assign`` returns."""
        self._group.subscribe(
            [self.topic],
            on_assign=lambda pairs: on_assign(self._parts(pairs)),
            on_revoke=lambda pairs: on_revoke(self._parts(pairs)),
            on_lost=lambda pairs: on_lost(self._parts(pairs)),
        )

    def consume(self, max_records: int, timeout_s: float) -> list[Record]:
        """Fetch up to ``max_records``; transient errors are logged, fatal ones raised."""
        return self._group.consume(max_records, timeout_s)

    def commit(
        self,
        offsets: dict[int, tuple[int, str]],
        *,
        asynchronous: bool,
        timeout_s: float = COMMIT_TIMEOUT_S,
    ) -> None:
        """Commit ``partition -> (next offset to read, metadata)``.

        A synchronous commit is bounded by ``timeout_s``: librdkafka's own waits for the
        coordinator's answer without a timeout (for as long as the broker is unreachable), which
        would wedge the consumer thread, and with it every partition of the worker. So the
        commit is sent asynchronously and then confirmed by reading the committed offsets back
        (a call with a timeout; the coordinator answers requests of one connection in order).
        Not confirmed in time: :class:`BrokerError` (those runs are delivered again to the
        partition's next owner). A synchronous commit from another thread instead hung for good
        inside a rebalance callback."""
        pairs = {(self.topic, p): o for p, (o, _meta) in offsets.items()}
        metadata = {(self.topic, p): meta for p, (_o, meta) in offsets.items()}
        self._group.commit(pairs, asynchronous=True, metadata=metadata)
        if asynchronous:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrokerError(
                    f"committing offsets {pairs} was not confirmed within {timeout_s:g} s "
                    "(broker unreachable?); those runs are delivered again to the partition's "
                    "next owner"
                )
            try:
                got = self._group.committed(list(pairs), left)
            except BrokerError:
                continue  # timed out or refused: the deadline decides
            if all(got.get(pair, (-1, ""))[0] >= offset for pair, offset in pairs.items()):
                return
            time.sleep(min(_CONFIRM_SLICE_S, max(0.0, left)))

    def committed(self, partitions: list[int], timeout_s: float) -> dict[int, tuple[int, str]]:
        """The group's committed offset and its metadata per partition (none: left out)."""
        got = self._group.committed([(self.topic, p) for p in partitions], timeout_s)
        return {p: v for (t, p), v in got.items() if t == self.topic}

    def pause(self, partitions: list[int]) -> None:
        self._group.pause([(self.topic, p) for p in partitions])

    def resume(self, partitions: list[int]) -> None:
        self._group.resume([(self.topic, p) for p in partitions])

    def assignment(self) -> list[int]:
        return self._parts(self._group.assignment())

    def member_id(self) -> str:
        """The group member id; empty while not a member (:meth:`GroupConsumer.member_id`)."""
        return self._group.member_id()

    def session_timeout_s(self) -> float:
        return self._session_timeout_ms / 1000

    def unsubscribe(self) -> None:
        self._group.unsubscribe()

    def lag(self) -> dict[int, int]:
        """Per assigned partition, records not fetched yet (no request to the broker)."""
        return {p: n for (t, p), n in self._group.lag().items() if t == self.topic}

    def close(self) -> None:
        """Leave the group now (the revoke callback runs first), so partitions move at once."""
        self._group.close()


#: Between two tries of :func:`read_acks_since`'s offset lookups.
_LOOKUP_RETRY_S = 0.2


@dataclass(frozen=True, slots=True)
class AcksSince:
    """What :func:`read_acks_since` found."""

    #: The acks appended since the times asked, up to each partition's end at the start.
    records: list[Record]
    #: Per partition, the runs topic's end offset before the acks were read: a run at or past
    #: it was dispatched after the read, so no ack read here can be about it.
    runs_ends: dict[int, int]
    #: False when the time or record bound cut the read short (some acks were not read).
    complete: bool


def read_acks_since(
    settings: Settings,
    runs_topic: str,
    since_ms: dict[int, int],
    timeout_s: float,
    limit: int,
) -> AcksSince:
    """The acks topic's records appended (broker time) from ``since_ms[partition]`` on, for a
    new owner of those runs partitions to see what its predecessor acknowledged but could not
    commit. The acks topic is co-partitioned with every runs topic. Bounded by ``timeout_s``
    and ``limit``; a broker error raises :class:`BrokerError`."""
    acks = settings.topics.acks
    reader = TopicReader(settings, _PACKAGE, "acks lookup", eof=True)
    try:
        deadline = time.monotonic() + timeout_s

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        while True:
            # A new client right after the broker came back may not know the topics' leaders
            # yet ("unknown partition"): asked again until the deadline.
            try:
                for topic in (runs_topic, acks):
                    reader.partitions(topic, left(), strict=True)
                runs_ends = {p: reader.end_offset(runs_topic, p, left()) for p in since_ms}
                starts: dict[int, int] = {}
                for p, ms in since_ms.items():
                    starts.update(reader.offsets_at(acks, [p], ms, left()))
                ends = {p: reader.end_offset(acks, p, left()) for p in starts}
                break
            except BrokerError:
                if time.monotonic() + _LOOKUP_RETRY_S >= deadline:
                    raise
                time.sleep(_LOOKUP_RETRY_S)
        unread = {p for p, o in starts.items() if o < ends[p]}
        records: list[Record] = []
        if unread:
            reader.assign({(acks, p): starts[p] for p in unread})
        while unread and len(records) < limit and time.monotonic() < deadline:
            got = reader.poll(min(0.5, left()))
            if isinstance(got, PartitionEnd):
                unread.discard(got.partition)
            elif got is not None and got.partition in unread:
                records.append(got)
                if got.offset + 1 >= ends[got.partition]:
                    unread.discard(got.partition)
        return AcksSince(records, runs_ends, not unread)
    finally:
        reader.close()


#: ``on_delivery(error)`` of :meth:`StatusProducer.produce`: None once the broker has the record.
DeliveryReport = Callable[[DeliveryError | None], None]


class StatusProducer:
    """Produces the worker's events; each record's delivery report calls its ``on_delivery``.

    Uses :func:`jobwheel.kafka.producer.producer_config` (idempotent, acks=all, murmur2):
    the scheduler that owns a job's partition reads its acknowledgements from the same partition
    number of the acks topic, so the partitioner must be the one every other producer uses.

    Delivery reports are served by one polling thread of this object, and ``on_delivery`` runs
    there: it must be quick and thread-safe (the pool marks offsets done under its lock and
    hands anything else to its event loop in batches).
    """

    def __init__(self, settings: Settings, **overrides: Any) -> None:
        self._producer = Producer(producer_config(settings, "worker", **overrides), _PACKAGE)
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
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        on_delivery: DeliveryReport,
    ) -> bool:
        """Hand a record to the producer; False (nothing queued) while its local queue is full.
        Records produced in call order are delivered in that order (idempotent producer)."""
        return self._producer.try_produce(
            topic, value, key, lambda error, _where: on_delivery(error), headers=headers
        )

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding deliveries; returns how many are still undelivered."""
        return self._producer.flush(timeout_s)

    def purge(self) -> None:
        """Drop what is queued or in flight, without waiting (the process is about to exit)."""
        self._producer.purge()

    def close(self, timeout_s: float = 10.0) -> int:
        remaining = self.flush(timeout_s)
        self._stop.set()
        self._poller.join(timeout=1.0)
        return remaining
