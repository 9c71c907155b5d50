"""What every consumer of jobwheel shares: fetched messages as plain :class:`Record` values
(client errors raised or logged the one way), the lag a consumer already knows, a partition's
offsets asked of its leader through a stale metadata cache, the config of a consumer that
commits only finished work, and :class:`GroupConsumer`, the group member of the
worker and the status sink (the scheduler's own are in ``streams/kafka.py``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from jobwheel.errors import BrokerError
from jobwheel.kafka.config import Service
from jobwheel.kafka.errors import broker_error, kafka_error, with_client_logging
from jobwheel.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


#: The first ask of a partition's leader waits this long; each later one waits as long as the
#: asking has taken so far (1, 1, 2, 4 s ...), until the caller's timeout.
LEADER_FIRST_ASK_S = 1.0
#: The pause after a leader's "not now" (below), before the metadata refresh and the next ask.
LEADER_RETRY_PAUSE_S = 0.1
#: How long "not now" answers are asked again: a new leader's high watermark catches up within
#: its followers' next fetches (0.5 s), but one whose followers are down too can say "not
#: caught up" for as long as they stay in its ISR (30 s), and the scheduler's loop waits here.
LEADER_NOT_NOW_S = 2.0
#: Answers of a leader that moved or was elected a moment ago ("Leader high watermark is not
#: caught up" comes from a new leader for its first moments).
_NOT_NOW = frozenset(
    {
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
)


def ask_leaders(consumer: Any, topic: str, timeout_s: float, ask: Callable[[float], T]) -> T:
    """``ask(wait_s)``: a request the client sends to the leaders of ``topic``'s partitions
    (their offsets, the offsets at a time), asked through a stale metadata cache.

    librdkafka sends it to the leader in its cache, and a consumer with no partition of the
    topic assigned has nothing else that would refresh that cache:

    - a cached "no leader" (an answer given while the leader's broker was restarting) fails at
      once with "Unknown partition", and stayed until the cache expired (15 minutes);
    - a cached leader whose broker was killed gets the ask, and it waits there for the whole
      timeout (measured on three nodes: 30.0 s of a 30 s timeout) although the partition has
      had a new leader for seconds; the scheduler's loop waited with it, once per partition.

    So the first ask is short, and after a failure the topic's metadata is asked for again
    (``list_topics`` refreshes the cache) before the next ask: a new leader, or one that is
    back, is found within about a second. Asks that time out go on until ``timeout_s``, each
    waiting as long as the asking has taken so far, so a broker that is slow but answering
    still answers. So does a leader elected a moment ago, whose first answers are "not
    caught up" (seen on the cluster right after a kill: two asks in a row got it): a leader's
    "not now" is asked again after a short pause, for up to :data:`LEADER_NOT_NOW_S`. An ask
    that fails at once in any other way ("no leader": every replica down), or a "not now"
    past that, after a refresh is the cluster's answer now: it is raised, and the caller asks
    again later rather than wait here. Raises the last ask's :class:`KafkaException`."""
    began = time.monotonic()
    deadline = began + timeout_s
    failed_at_once = 0
    while True:
        asked = time.monotonic()
        wait = min(max(LEADER_FIRST_ASK_S, asked - began), deadline - asked)
        try:
            return ask(max(0.1, wait))
        except KafkaException as exc:
            last = exc
            err = kafka_error(exc)
            code = None if err is None else err.code()
        if code in _NOT_NOW and time.monotonic() - began < LEADER_NOT_NOW_S:
            time.sleep(max(0.0, min(LEADER_RETRY_PAUSE_S, deadline - time.monotonic())))
        elif code != KafkaError._TIMED_OUT:
            failed_at_once += 1
        if failed_at_once > 1 or time.monotonic() >= deadline:
            raise last
        try:
            consumer.list_topics(
                topic, timeout=max(0.1, min(LEADER_FIRST_ASK_S, deadline - time.monotonic()))
            )
        except KafkaException:
            pass  # no broker answered metadata either: the next ask fails or finds the leader


def ask_watermarks(consumer: Any, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
    """``(first offset, end offset)`` of a partition, asked of its leader (:func:`ask_leaders`);
    the end is the last stable offset for a ``read_committed`` consumer, the high watermark
    otherwise."""
    tp = TopicPartition(topic, partition)
    low, high = ask_leaders(
        consumer, topic, timeout_s, lambda wait: consumer.get_watermark_offsets(tp, timeout=wait)
    )
    return int(low), int(high)


class Record(NamedTuple):
    """A consumed record. ``timestamp_ms`` is the record's timestamp (the broker's append time
    on the acks topic). A named tuple: one is built per record consumed, and a tuple is built
    several times faster than a frozen dataclass."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    timestamp_ms: int
    #: ``timestamp_ms`` is the broker's append time (the topic's LogAppendTime), not a
    #: producer's clock.
    broker_time: bool = False


def records(messages: list[Any], what: str = "consuming") -> list[Record]:
    """The records among ``messages``: a fatal client error raises :class:`BrokerError`, any
    other error message is logged and skipped (librdkafka recovers from those itself)."""
    out: list[Record] = []
    for msg in messages:
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise BrokerError(f"{what} failed: {err.str()}", code=err.name())
            log.warning("consumer error", extra={"code": err.name(), "error": err.str()})
            continue
        partition, offset = msg.partition(), msg.offset()
        if partition is None or offset is None:
            continue
        out.append(
            Record(
                msg.topic(),
                partition,
                offset,
                msg.key(),
                msg.value(),
                msg.headers(),
                (stamp := msg.timestamp())[1],
                stamp[0] == TIMESTAMP_LOG_APPEND_TIME,
            )
        )
    return out


def cached_lag(consumer: Any) -> dict[tuple[str, int], int]:
    """Per assigned partition, records not fetched yet: the end offset as of the last fetch
    response minus the position (no request to the broker). A partition not fetched yet
    counts 0; a client error leaves the sample out (logged at debug)."""
    out: dict[tuple[str, int], int] = {}
    try:
        for tp in consumer.position(consumer.assignment()):
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            known = high >= 0 and tp.offset >= 0
            out[(tp.topic, tp.partition)] = max(0, high - tp.offset) if known else 0
    except KafkaException as exc:
        log.debug("lag not sampled", extra={"error": str(exc)})
    return out


def committing_consumer_config(
    settings: Settings,
    group: str,
    defaults: dict[str, Any],
    service: Service | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The config of a consumer that commits only what it finished (the worker, the status
    sink): ``defaults``, the consumer's pass-through layers (of ``service``), then keys the
    pass-through cannot change: manual commits and offset stores, and ``read_committed`` so
    records of an aborted scheduler transaction (a fenced owner's) are never seen; then
    ``overrides``."""
    required = {
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
    }
    passed = settings.librdkafka("consumer", service)
    config = {**defaults, **settings.librdkafka("consumer", service, **required, **overrides)}
    if str(config.get("group.protocol", "classic")) == "consumer":
        # KIP-848: the broker owns assignment and session timing; librdkafka refuses a
        # consumer given these keys, so the classic defaults go (an operator's stay, and
        # librdkafka's refusal names them).
        for key in CLASSIC_ONLY_KEYS - passed.keys():
            config.pop(key, None)
    chosen = "partition.assignment.strategy" in passed
    return with_static_assignor(config, chosen=chosen)


#: Consumer keys of the classic group protocol that librdkafka refuses with ``consumer``.
CLASSIC_ONLY_KEYS = frozenset(
    {"partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"}
)


#: The assignor of a static member (``group.instance.id``) of a classic group.
STATIC_ASSIGNOR = "range"


def with_static_assignor(config: dict[str, Any], *, chosen: bool) -> dict[str, Any]:
    """A static member of a classic group assigns eagerly (``range``), not cooperatively.

    Why: under cooperative-sticky a partition that moves is first revoked by its owner and only
    handed on in a second rebalance, which that owner starts once it has revoked it. A static
    member killed while revoking (our worker waits for its runs to finish there) comes back
    under the same ``group.instance.id`` and the coordinator hands the new process the dead
    one's stored assignment without a rebalance: the partitions being moved belong to no one,
    and stay so while the group is stable (seen: a restarted worker got partitions 2 and 3,
    0 and 1 had no owner for minutes, their runs never ran). An eager assignment covers every
    partition in each generation, so a replaced static member never leaves one out; static
    members rebalance rarely (a restart is no rebalance), so eager's pause is rare too.
    ``chosen``: the operator set the strategy in a pass-through config; then it stands, with a
    warning if it is the cooperative one."""
    static = bool(config.get("group.instance.id"))
    classic = str(config.get("group.protocol", "classic")) == "classic"
    if not (static and classic):
        return config
    strategy = str(config.get("partition.assignment.strategy", ""))
    if not chosen:
        return {**config, "partition.assignment.strategy": STATIC_ASSIGNOR}
    if "cooperative" in strategy:
        log.warning(
            "static membership with a cooperative assignor can leave partitions unowned",
            extra={
                "group_instance_id": config["group.instance.id"],
                "partition.assignment.strategy": strategy,
                "why": "a static member killed while revoking comes back with its old "
                "assignment and no rebalance hands on what it was revoking",
                "fix": f"drop partition.assignment.strategy from the Kafka consumer config "
                f"(static members then use {STATIC_ASSIGNOR}), or drop group.instance.id",
            },
        )
    return config


Pairs = list[tuple[str, int]]
PairsCallback = Callable[[Pairs], None]

#: How long after its assignment a partition that has given no record may be assigned again
#: when its committed offset was not fetched (:meth:`GroupConsumer._fetch_offsets_again`).
#: The failed fetch is reported within seconds of the assignment.
FRESH_S = 120.0


def offsets_not_fetched(err: KafkaError) -> bool:
    """The consumer error librdkafka reports when the committed offsets of newly assigned
    partitions could not be fetched because the group coordinator had moved ("Failed to fetch
    committed offsets for 0 partition(s) ...: Broker: Not coordinator")."""
    return err.code() == KafkaError.NOT_COORDINATOR and "committed offsets" in err.str()


class GroupConsumer:
    """A consumer group member that speaks ``(topic, partition)`` pairs and :class:`Record`
    values (the worker's runs consumer, the status sink). One thread at a time: rebalance
    callbacks run inside :meth:`consume` on the calling thread."""

    def __init__(self, config: dict[str, Any], package: str, what: str) -> None:
        self.what = what
        try:
            self._consumer = Consumer(with_client_logging(config, package))
        except KafkaException as exc:
            raise broker_error(exc, f"could not create the {what}; check kafka_config") from exc
        self._closed = False
        #: Assigned partitions that have given no record yet -> when they were assigned.
        self._fresh: dict[tuple[str, int], float] = {}
        #: Partitions the caller paused (kept paused when they are assigned again).
        self._paused: set[tuple[str, int]] = set()

    def subscribe(
        self,
        topics: list[str],
        on_assign: PairsCallback,
        on_revoke: PairsCallback,
        on_lost: PairsCallback,
    ) -> None:
        """Join the group; confluent-kafka applies the (incremental) assignment itself after
        ``on_assign`` returns."""

        def pairs(tps: list[TopicPartition]) -> Pairs:
            return [(tp.topic, tp.partition) for tp in tps]

        def assigned(tps: list[TopicPartition]) -> None:
            now = time.monotonic()
            for pair in pairs(tps):
                self._fresh[pair] = now
            on_assign(pairs(tps))

        def gone(callback: PairsCallback, tps: list[TopicPartition]) -> None:
            for pair in pairs(tps):
                self._fresh.pop(pair, None)
                self._paused.discard(pair)
            callback(pairs(tps))

        self._consumer.subscribe(
            topics,
            on_assign=lambda _c, tps: assigned(tps),
            on_revoke=lambda _c, tps: gone(on_revoke, tps),
            on_lost=lambda _c, tps: gone(on_lost, tps),
        )

    def consume(self, max_records: int, timeout_s: float) -> list[Record]:
        """Fetch up to ``max_records``; transient errors are logged, fatal ones raised."""
        try:
            messages = self._consumer.consume(max_records, timeout_s)
        except KafkaException as exc:
            raise broker_error(exc, f"{self.what}: consuming failed") from exc
        out = records(messages, f"{self.what}: consuming")
        if self._fresh:
            self._forget_fresh(out)
            if len(out) < len(messages) and any(
                (err := msg.error()) is not None and offsets_not_fetched(err) for msg in messages
            ):
                self._fetch_offsets_again()
        return out

    def _forget_fresh(self, out: list[Record]) -> None:
        """Partitions that gave a record (or were assigned long ago) are fetching."""
        fresh = self._fresh
        for record in out:
            fresh.pop((record.topic, record.partition), None)
        oldest = time.monotonic() - FRESH_S
        for pair in [pair for pair, at in fresh.items() if at < oldest]:
            del fresh[pair]

    def _fetch_offsets_again(self) -> None:
        """Assign the partitions that have given no record since their assignment again, so
        librdkafka fetches their committed offsets once more.

        When that fetch fails as a whole with "Not coordinator" (a broker that woke from a
        freeze, a coordinator that moved), librdkafka leaves the partitions waiting for an
        answer that never comes and never asks again (librdkafka issue 5586): they are owned,
        never fetched, and their runs never run, while the consumer stays a healthy member.
        Those partitions gave no record yet, so assigning them again skips and repeats
        nothing: each starts at its committed offset, where it would have started. A partition
        that is fetching and merely idle is among them, harmlessly. A new failure is reported
        again and answered the same way."""
        again = [TopicPartition(t, p) for t, p in self._fresh]
        paused = [tp for tp in again if (tp.topic, tp.partition) in self._paused]
        try:
            self._consumer.incremental_unassign(again)
            self._consumer.incremental_assign(again)
            if paused:
                self._consumer.pause(paused)
        except KafkaException as exc:
            log.warning(
                f"{self.what}: assigning partitions again to fetch their offsets failed",
                extra={"error": str(exc)},
            )
            return
        log.warning(
            f"{self.what}: the committed offsets of assigned partitions were not fetched "
            "(the group coordinator moved); assigning them again",
            extra={"partitions": sorted(self._fresh)},
        )

    def commit(
        self,
        offsets: dict[tuple[str, int], int],
        *,
        asynchronous: bool,
        metadata: dict[tuple[str, int], str] | None = None,
    ) -> None:
        """Commit ``(topic, partition) -> next offset to read`` (with each pair's ``metadata``
        string, if given); raises :class:`BrokerError`."""
        if not offsets:
            return
        meta = metadata or {}
        tps = [
            TopicPartition(t, p, o, metadata=meta[(t, p)])
            if meta.get((t, p))
            else TopicPartition(t, p, o)
            for (t, p), o in offsets.items()
        ]
        try:
            self._consumer.commit(offsets=tps, asynchronous=asynchronous)
        except KafkaException as exc:
            raise broker_error(exc, f"committing offsets {offsets} failed") from exc

    def committed(self, pairs: Pairs, timeout_s: float) -> dict[tuple[str, int], tuple[int, str]]:
        """The group's committed offset and its metadata per pair (pairs without a committed
        offset left out); raises :class:`BrokerError`, also when ``timeout_s`` passes."""
        if not pairs:
            return {}
        try:
            tps = self._consumer.committed(
                [TopicPartition(t, p) for t, p in pairs], timeout=timeout_s
            )
        except KafkaException as exc:
            raise broker_error(exc, f"{self.what}: reading committed offsets failed") from exc
        return {
            (tp.topic, tp.partition): (tp.offset, tp.metadata or "")
            for tp in tps
            if tp.error is None and tp.offset >= 0
        }

    def pause(self, pairs: Pairs) -> None:
        if pairs:
            self._consumer.pause([TopicPartition(t, p) for t, p in pairs])
            self._paused.update(pairs)

    def resume(self, pairs: Pairs) -> None:
        if pairs:
            self._consumer.resume([TopicPartition(t, p) for t, p in pairs])
            self._paused.difference_update(pairs)

    def assignment(self) -> Pairs:
        return [(tp.topic, tp.partition) for tp in self._consumer.assignment()]

    def member_id(self) -> str:
        """The member id the group coordinator gave this consumer; empty while it is not a
        member (before its first join, and after a session timeout or a leave until it has
        joined again)."""
        return self._consumer.memberid() or ""

    def unsubscribe(self) -> None:
        """Leave the group and stop joining it (the revoke callback runs first)."""
        try:
            self._consumer.unsubscribe()
        except KafkaException as exc:
            raise broker_error(exc, f"{self.what}: unsubscribing failed") from exc

    def lag(self) -> dict[tuple[str, int], int]:
        return cached_lag(self._consumer)

    def close(self) -> None:
        """Leave the group now (the revoke callback runs first), so partitions move at once."""
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()
        except KafkaException as exc:
            log.warning(f"closing the {self.what} failed", extra={"error": str(exc)})
