"""The scheduler's own Kafka clients: thin confluent-kafka wrappers that speak partition
numbers, :class:`Record` values and :mod:`jobwheel.errors`, built on the shared plumbing of
:mod:`jobwheel.kafka` (records, lag, client logging, error translation).

Four clients per scheduler process, all driven from the engine's one thread:

- :class:`InputConsumer`: the consumer group member. It subscribes to the requests topic; the
  group (cooperative: KIP-848's ``consumer`` protocol by default, or classic
  ``cooperative-sticky``; eager ``range`` for static members) decides which partitions this
  process owns. New partitions arrive *paused*: the engine resumes them once their state is
  restored.
- :class:`AcksConsumer`: reads the acks partitions of the partitions this process owns
  (assigned by hand, mirroring the group's assignment, so acks partition ``p`` always goes with
  requests partition ``p`` whatever the group protocol's assignor does). Its offsets are
  committed in the scheduler's group with the others.
- :class:`ChangelogReader`: reads changelog partitions (``read_committed``) to restore state.
- :class:`TransactionalProducer`: one per process (Kafka's exactly-once v2, KIP-447). Each
  engine iteration is one transaction: outputs, changelog records and the consumed offsets
  (``send_offsets_to_transaction`` with the group's metadata, so a member that has been fenced
  out of the group cannot commit) commit together or not at all.

Errors follow librdkafka's transactional API: a retriable error is retried by calling the same
method again (a timed-out commit or abort must be *resumed*, never replaced by another call;
``send_offsets_to_transaction`` is the exception, see :meth:`TransactionalProducer.commit`);
:class:`TransactionAbortedError` means abort and redo the batch; :class:`FencedError` means this
producer is unusable (fenced by a newer one, or a fatal error): the engine drops its partitions'
uncommitted work, makes a new producer and claims them again (it stays in the group).

No blocking transactional call is trusted to return: librdkafka's
``send_offsets_to_transaction`` can ignore its timeout and wait for good after a broker restart
(librdkafka issues 5456, 5511). Each one (and the group consumer's close) runs under the
engine's :class:`~jobwheel.watchdog.CallWatchdog`, which ends the process when a call outlives
``JOBWHEEL_SCHEDULER_CALL_DEADLINE_MS`` (the module doc there says why exit, not replace).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from jobwheel.errors import BrokerError, DeliveryError, FencedError, TransactionAbortedError
from jobwheel.kafka.config import CLIENT_DEFAULTS
from jobwheel.kafka.consumer import STATIC_ASSIGNOR, Record, ask_watermarks, records
from jobwheel.kafka.errors import kafka_error, with_client_logging
from jobwheel.kafka.producer import PRODUCER_DEFAULTS
from jobwheel.logs import Throttle
from jobwheel.settings import Settings
from jobwheel.watchdog import CallWatchdog, kafka_reachable

log = logging.getLogger(__name__)
# A broker outage makes every client report every reconnect attempt: one line per kind per
# half minute is enough to tell what is going on.
log.addFilter(Throttle())

#: librdkafka's "no offset" value for a partition without a committed offset.
NO_OFFSET = -1001
_RETRY_PAUSE_S = 0.2


def broker_error(exc: KafkaException, what: str) -> BrokerError:
    """The jobwheel error for a failed transactional or consumer call."""
    err = kafka_error(exc)
    if err is None:
        return BrokerError(f"{what}: {exc}")
    message = f"{what}: {err.str()} ({err.name()})"
    if err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
        return FencedError(
            message + "; this producer can no longer commit (a newer scheduler instance took "
            "over or the error is fatal): partitions are claimed again with a new producer",
            code=err.name(),
        )
    if err.txn_requires_abort():
        return TransactionAbortedError(message, code=err.name())
    return BrokerError(message, code=err.name())


def scheduler_watchdog(
    settings: Settings, reachable: Callable[[], bool] | None = None
) -> CallWatchdog:
    """The deadline of the scheduler's blocking Kafka calls (one per process: it outlives the
    producers a reset replaces); ``reachable``: the process's probe, when it has one."""
    return CallWatchdog(
        settings.scheduler_call_deadline_s,
        what="scheduler",
        setting="JOBWHEEL_SCHEDULER_CALL_DEADLINE_MS",
        reachable=reachable or kafka_reachable(settings),
    )


def _client(factory: Callable[[dict[str, Any]], Any], config: dict[str, Any], what: str) -> Any:
    try:
        return factory(with_client_logging(config, "jobwheel.streams"))
    except KafkaException as exc:
        raise BrokerError(f"could not create the {what}: {exc}; check kafka_config") from exc


def consumer_config(
    settings: Settings, defaults: dict[str, Any], forced: dict[str, Any]
) -> dict[str, Any]:
    """A scheduler consumer's config: ``defaults``, the consumer pass-through layers of the
    scheduler, then ``forced``. A ``group.instance.id`` from the pass-through is dropped: every
    scheduler process reads the same config, and two members of the scheduler group with one
    static id fence each other in a loop. With JOBWHEEL_SCHEDULER_STATIC_MEMBERSHIP the group
    member gets an id of its own (its instance id)."""
    config = {**defaults, **settings.librdkafka("consumer", "scheduler", **forced)}
    ignored = config.pop("group.instance.id", None)
    if ignored is not None and not _warned_static.is_set():
        _warned_static.set()
        log.warning(
            "group.instance.id in the Kafka consumer config is ignored by the scheduler",
            extra={
                "group_instance_id": ignored,
                "fix": "each scheduler instance needs a static id of its own: set "
                "JOBWHEEL_SCHEDULER_STATIC_MEMBERSHIP=true (classic group protocol) and give "
                "the static id to workers only (JOBWHEEL_WORKER_KAFKA_CONSUMER_CONFIG)",
            },
        )
    return config


def _watermarks(consumer: Any, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
    """``(first offset, end offset)`` of a partition (:func:`ask_watermarks`: asked of its
    leader again after a metadata refresh, so a stale cache neither fails it nor holds it)."""
    try:
        return ask_watermarks(consumer, topic, partition, timeout_s)
    except KafkaException as exc:
        raise broker_error(exc, f"reading the offsets of {topic}/{partition}") from exc


_warned_static = threading.Event()
PartitionsCallback = Callable[[list[int]], None]


class _TopicReader:
    """What every consumer here does with its one topic's partitions."""

    topic: str
    _consumer: Any

    def seek(self, partition: int, offset: int) -> None:
        """Read ``partition`` again from ``offset`` (after an aborted transaction); a negative
        offset means from the start (nothing was committed yet)."""
        start = offset if offset >= 0 else OFFSET_BEGINNING
        try:
            self._consumer.seek(TopicPartition(self.topic, partition, start))
        except KafkaException as exc:
            raise broker_error(exc, f"seeking {self.topic}/{partition} to {start}") from exc

    def cached_end(self, partition: int) -> int | None:
        """The partition's end offset as of the last fetch response (no request), or None."""
        try:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), cached=True
            )
        except KafkaException:
            return None
        return high if high >= 0 else None

    def position(self, partition: int) -> int | None:
        """The next offset to be returned for ``partition`` (past transaction markers), once
        known (after a fetch), or None."""
        [tp] = self._consumer.position([TopicPartition(self.topic, partition)])
        return tp.offset if tp.offset >= 0 else None


class InputConsumer(_TopicReader):
    """The scheduler group's member, subscribed to the requests topic."""

    def __init__(
        self, settings: Settings, client_id: str, watchdog: CallWatchdog | None = None
    ) -> None:
        self.topic = settings.topics.requests
        self._watchdog = watchdog or scheduler_watchdog(settings)
        protocol = settings.scheduler_group_protocol
        static = settings.scheduler_static_membership and protocol == "classic"
        #: Eager (``assign``) rather than incremental assignment: a static member of a classic
        #: group (see jobwheel.kafka.consumer.with_static_assignor for why it is not
        #: cooperative).
        self._eager = self.static = static
        timing: dict[str, Any] = (
            {}  # KIP-848: assignment, session and heartbeat are the group's (broker-side) config
            if protocol == "consumer"
            else {
                "partition.assignment.strategy": (
                    STATIC_ASSIGNOR if static else "cooperative-sticky"
                ),
                "session.timeout.ms": settings.scheduler_session_timeout_ms,
                "heartbeat.interval.ms": settings.scheduler_heartbeat_interval_ms,
            }
        )
        config = consumer_config(
            settings,
            {"auto.offset.reset": "earliest", "fetch.wait.max.ms": 20, **timing},
            {
                "group.id": settings.scheduler_app_id,
                "group.protocol": protocol,
                "client.id": client_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
            },
        )
        if static:
            config["group.instance.id"] = client_id
        self._consumer = _client(Consumer, config, "scheduler consumer")

    def subscribe(
        self,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        """Join the group. Assigned partitions start paused (see the module doc)."""

        def assigned(consumer: Any, tps: list[TopicPartition]) -> None:
            if self._eager:
                consumer.assign(tps)  # the whole assignment, after the whole was revoked
            else:
                consumer.incremental_assign(tps)
            if tps:
                consumer.pause(tps)
            on_assign([tp.partition for tp in tps])

        self._consumer.subscribe(
            [self.topic],
            on_assign=assigned,
            on_revoke=lambda _c, tps: on_revoke([tp.partition for tp in tps]),
            on_lost=lambda _c, tps: on_lost([tp.partition for tp in tps]),
        )

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        """Up to ``max_records``, waiting at most ``timeout_s`` for the first one only.

        ``consume(n, t)`` waits for n records or the whole of t: one ``--now`` command arriving
        at an idle scheduler would wait out the poll timeout (up to 100 ms) before it fires,
        where a timed job fires on the dot. So wait for one record, then take what else is
        already fetched without waiting."""
        try:
            first = self._consumer.consume(1, timeout_s)
            if not first or max_records <= 1:
                return records(first)
            return records(first + self._consumer.consume(max_records - 1, 0))
        except KafkaException as exc:
            raise broker_error(exc, "consuming requests failed") from exc

    def resume(self, partition: int) -> None:
        self._consumer.resume([TopicPartition(self.topic, partition)])

    def pause(self, partition: int) -> None:
        self._consumer.pause([TopicPartition(self.topic, partition)])

    def committed(
        self, pairs: Sequence[tuple[str, int]], timeout_s: float = 10.0
    ) -> dict[tuple[str, int], int]:
        """The group's committed offsets of ``(topic, partition)`` pairs (``NO_OFFSET`` where
        there is none), in one request.

        Stable offsets only: this consumer is ``read_committed``, so librdkafka asks with
        ``require_stable`` (KIP-447) and the broker holds the answer back while a transaction
        with offsets for the partition is still open (a previous owner's, committing or about
        to be aborted); past ``timeout_s`` this raises, and the caller asks again."""
        tps = [TopicPartition(topic, p) for topic, p in pairs]
        names = ", ".join(sorted({topic for topic, _p in pairs}))
        try:
            found = self._consumer.committed(tps, timeout=timeout_s)
        except KafkaException as exc:
            raise broker_error(exc, f"reading the committed offsets of {names} failed") from exc
        for tp in found:
            if tp.error is not None:
                raise BrokerError(
                    f"reading the committed offset of {tp.topic}/{tp.partition} failed: "
                    f"{tp.error.str()}",
                    code=tp.error.name(),
                )
        return {(tp.topic, tp.partition): tp.offset for tp in found}

    def topic_names(self, timeout_s: float) -> list[str]:
        """The names of every topic on the broker (a metadata request for all of them: naming
        one would let a broker that auto-creates topics create it)."""
        return list(self._consumer.list_topics(timeout=timeout_s).topics)

    def group_metadata(self) -> Any:
        return self._consumer.consumer_group_metadata()

    def close(self) -> None:
        """Leave the group (the revoke callback runs first)."""
        try:
            with self._watchdog.watch("closing the scheduler consumer"):
                self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the scheduler consumer failed", extra={"error": str(exc)})


class _AssignedConsumer(_TopicReader):
    """A consumer that is assigned partitions of one topic by hand (no group membership)."""

    def __init__(self, topic: str, config: dict[str, Any], what: str) -> None:
        self.topic = topic
        self._what = what
        self._config = config
        self._consumer = _client(Consumer, config, what)
        # Assigned partition -> the offset it was assigned at (where a rebuild starts it
        # again when nothing of it has been read yet).
        self._starts: dict[int, int] = {}

    @property
    def assigned(self) -> set[int]:
        return set(self._starts)

    def assign(self, partition: int, offset: int) -> None:
        start = offset if offset >= 0 else OFFSET_BEGINNING
        self._consumer.incremental_assign([TopicPartition(self.topic, partition, start)])
        self._starts[partition] = start

    def unassign(self, partition: int) -> None:
        if partition in self._starts:
            del self._starts[partition]
            self._consumer.incremental_unassign([TopicPartition(self.topic, partition)])

    def rebuild(self) -> None:
        """Replace the client by a new one, assigned the same partitions at the positions
        reached (nothing read is read again, nothing is skipped).

        What a stale client state costs is open-ended: librdkafka keeps a metadata answer
        in its cache until something asks again, and some of its lookups never ask
        (:meth:`watermarks`). A new client starts with nothing cached; the caller rebuilds
        once a partition has been failing for a bounded time, whatever the reason."""
        starts = dict(self._starts)
        for p in starts:
            reached = self.position(p)
            if reached is not None:
                starts[p] = reached
        self.close()
        self._consumer = _client(Consumer, self._config, self._what)
        self._starts = {}
        if starts:
            self._consumer.incremental_assign(
                [TopicPartition(self.topic, p, o) for p, o in sorted(starts.items())]
            )
            self._starts = starts

    def pause(self, partition: int) -> None:
        if partition in self._starts:
            self._consumer.pause([TopicPartition(self.topic, partition)])

    def resume(self, partition: int) -> None:
        if partition in self._starts:
            self._consumer.resume([TopicPartition(self.topic, partition)])

    def poll(self, max_records: int, timeout_s: float) -> list[Record]:
        if not self._starts:
            if timeout_s > 0:
                time.sleep(timeout_s)
            return []
        try:
            return records(self._consumer.consume(max_records, timeout_s))
        except KafkaException as exc:
            raise broker_error(exc, f"consuming {self._what} failed") from exc

    def watermarks(self, partition: int, timeout_s: float = 10.0) -> tuple[int, int]:
        """``(first offset, end offset)`` of the partition, asked of the partition's leader
        (the end as this consumer's isolation level sees it: :func:`_watermarks`)."""
        return _watermarks(self._consumer, self.topic, partition, timeout_s)

    def close(self) -> None:
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning(f"closing the {self._what} consumer failed", extra={"error": str(exc)})


class AcksConsumer(_AssignedConsumer):
    """The acks partitions of the owned partitions (see the module doc)."""

    def __init__(self, settings: Settings, client_id: str) -> None:
        config = consumer_config(
            settings,
            {"fetch.wait.max.ms": 20},
            {
                # Never subscribes or commits: offsets go through the transaction.
                "group.id": settings.scheduler_app_id,
                "client.id": client_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # A committed offset out of range (the records under it deleted by retention,
                # or a partition truncated) restarts at the oldest ack still there, never at
                # the end: an ack read twice is dropped by the processor (its run is no longer
                # in flight, or the same verdict again), an ack skipped is a verdict lost and
                # its run dispatched again at its deadline. librdkafka logs every reset caused
                # by an error as a warning ("offset reset ... Offset out of range").
                "auto.offset.reset": "earliest",
            },
        )
        super().__init__(settings.topics.acks, config, "acks")


class ChangelogReader(_AssignedConsumer):
    """Reads the job store's changelog to restore partitions (``read_committed``).

    Its :meth:`watermarks` give the end as the *high watermark*, not the last stable offset
    its own ``read_committed`` reads would give. A transaction that has committed can still
    be undecided on the changelog partition: the coordinator writes the commit markers after
    ``commit_transaction`` returns, and a marker for a partition whose leader has just moved
    (a broker cut off) comes seconds later. Until it does, the last stable offset stops before
    that transaction's records, although its consumed offsets are committed. A claim that
    restored only that far had offsets past inputs whose state it never read: the jobs they
    fired were fired again, and a local checkpoint past that end was taken for a changelog
    that had lost records, and wiped. Reading to the high watermark, a restore waits until
    every transaction under it is decided (committed ones are applied, aborted ones skipped).
    A client of its own measures that end: a consumer's isolation level is its whole config's.
    """

    def poll_changes(
        self, max_records: int, timeout_s: float
    ) -> list[tuple[int, int, bytes | None, bytes | None]]:
        """``(partition, offset, key, value)`` of the next changelog records: the lean path a
        restore of millions of records takes (no :class:`Record` per message)."""
        if not self._starts:
            return []
        try:
            messages = self._consumer.consume(max_records, timeout_s)
        except KafkaException as exc:
            raise broker_error(exc, "reading the changelog failed") from exc
        out = []
        for msg in messages:
            if msg.error() is None:
                out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
            elif msg.error().fatal():
                raise BrokerError(f"reading the changelog failed: {msg.error().str()}")
        return out

    def __init__(self, settings: Settings, client_id: str) -> None:
        defaults = {
            "fetch.wait.max.ms": 50,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            # librdkafka stops fetching a partition whose local queue holds queued.min.messages
            # (100k) and then waits fetch.queue.backoff.ms (1 s) before fetching again: in a
            # restore of a million records that second is paid again and again (measured: 1M
            # records in 5.7 s with the defaults, 2.0 s without the pause). The queue stays
            # bounded by queued.max.messages.kbytes.
            "queued.min.messages": 1_000_000,
            "fetch.queue.backoff.ms": 0,
            # The prefetch queue is per assigned partition: 4 MiB each keeps a restore of every
            # partition at once (standby copies) within tens of MiB, at the same speed.
            "queued.max.messages.kbytes": 4096,
        }
        config = consumer_config(
            settings,
            defaults,
            {
                "group.id": f"{settings.scheduler_app_id}-restore",
                "client.id": client_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            },
        )
        super().__init__(settings.topics.changelog(settings.scheduler_app_id), config, "changelog")
        self._ends_config = {**config, "isolation.level": "read_uncommitted"}
        self._ends = _client(Consumer, self._ends_config, "changelog end reader")

    def watermarks(self, partition: int, timeout_s: float = 10.0) -> tuple[int, int]:
        """``(first offset, high watermark)`` (see the class doc)."""
        return _watermarks(self._ends, self.topic, partition, timeout_s)

    def rebuild(self) -> None:
        """A new reading client (see :meth:`_AssignedConsumer.rebuild`) and a new measuring
        one: a stale metadata cache can hold either back."""
        super().rebuild()
        self._close_ends()
        self._ends = _client(Consumer, self._ends_config, "changelog end reader")

    def close(self) -> None:
        super().close()
        self._close_ends()

    def _close_ends(self) -> None:
        try:
            self._ends.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the changelog end reader failed", extra={"error": str(exc)})


class TransactionalProducer:
    """One transactional producer; every call blocks the engine's thread (see the module doc).

    ``changelog_offsets`` collects, per partition, the highest offset of the records produced
    with ``track`` (the changelog's) delivered in the current transaction: after a commit it is
    where the local state's checkpoint goes.
    """

    def __init__(
        self,
        settings: Settings,
        transactional_id: str,
        watchdog: CallWatchdog | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        self.watchdog = watchdog or scheduler_watchdog(settings)
        config = {
            "acks": "all",
            "enable.idempotence": True,
            # Short: a scheduler that dies mid-transaction holds back every read_committed
            # reader of the partitions it wrote (workers, a restoring scheduler) until the
            # broker aborts it. A transaction normally lasts milliseconds (one loop iteration).
            "transaction.timeout.ms": settings.scheduler_transaction_timeout_ms,
            # The engine produces a transaction's records right before committing it. Sent
            # while the produce loop goes on (a request every 5 ms), most of them are on the
            # broker when the commit is asked for; held back until the commit flushes them
            # (linger 1 s), the commit waited for all of them: 28 ms a commit instead of 9
            # at 5,000 jobs/s, a tenth of the loop's time blocked. End to end the two were
            # within the noise of runs in turn (load/RESULTS.md), the broker's CPU included.
            "linger.ms": 5,
            "compression.type": PRODUCER_DEFAULTS["compression.type"],
            **settings.librdkafka(
                "producer",
                "scheduler",
                **{
                    "transactional.id": transactional_id,
                    "client.id": transactional_id,
                },
            ),
        }
        if config.get("socket.timeout.ms") == CLIENT_DEFAULTS["socket.timeout.ms"]:
            # librdkafka refuses a transactional producer whose requests may outlive its
            # transactions (socket.timeout.ms at most transaction.timeout.ms + 100): jobwheel's
            # default gives way to a shorter transaction timeout. A value the pass-through set
            # is left for librdkafka to judge (its error names both).
            config["socket.timeout.ms"] = min(
                CLIENT_DEFAULTS["socket.timeout.ms"], int(config["transaction.timeout.ms"])
            )
        self.timeout_s = settings.scheduler_call_timeout_s
        self._offsets_deadline_s = settings.scheduler_offsets_deadline_s
        self._producer = _client(Producer, config, "transactional producer")
        self.changelog_offsets: dict[int, int] = {}
        self.in_transaction = False
        self._fault_commit_delay_s = settings.scheduler_fault_commit_delay_ms / 1000

    def _on_changelog(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            p = msg.partition()
            offset = msg.offset()
            if offset > self.changelog_offsets.get(p, -1):
                self.changelog_offsets[p] = offset

    def _resume(
        self,
        call: Callable[[], Any],
        what: str,
        give_up_s: float,
        hung_after_s: float | None = None,
    ) -> None:
        """Call until it succeeds; a retriable failure (a timeout) is resumed by calling the
        same method again, as librdkafka requires. Each call runs under the watchdog: one that
        never returns ends the process (see the module doc), after ``hung_after_s`` when
        given, else the watchdog's deadline."""
        deadline = time.monotonic() + give_up_s
        while True:
            try:
                with self.watchdog.watch(what, hung_after_s):
                    call()
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                retriable = (
                    err is not None
                    and err.retriable()
                    and not err.fatal()
                    and not err.txn_requires_abort()
                )
                if not retriable or time.monotonic() >= deadline:
                    if retriable:  # still timing out: nothing left to resume safely
                        raise FencedError(
                            f"{what} did not complete within {give_up_s:.0f}s "
                            f"({err.str() if err else exc}); the producer is replaced",
                            code=err.name() if err else None,
                        ) from exc
                    raise broker_error(exc, what) from exc
                log.warning(
                    "transaction call timed out; resuming it",
                    extra={"call": what, "error": err.str() if err else str(exc)},
                )
                time.sleep(_RETRY_PAUSE_S)

    def init(self, give_up_s: float = 60.0) -> None:
        """Register the transactional id: fences a previous producer with the same id and
        aborts its open transaction. Asked in short steps, so a broker that comes back is
        noticed within seconds."""
        self._resume(lambda: self._producer.init_transactions(2.0), "init_transactions", give_up_s)

    def begin(self) -> None:
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise broker_error(exc, "begin_transaction") from exc
        self.in_transaction = True
        self.changelog_offsets = {}

    def produce(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
        *,
        track: bool = False,
    ) -> None:
        """Queue a record in the open transaction. ``track``: its offset, once delivered, goes
        into ``changelog_offsets`` (a changelog partition's last record of the transaction:
        records of one partition are delivered in order, so its offset is the highest).

        Raises :class:`DeliveryError` with code ``MSG_SIZE_TOO_LARGE`` (the transaction stays
        usable: the caller replaces the record) and :class:`BrokerError`/:class:`FencedError`
        for anything that breaks the transaction.
        """
        callback = self._on_changelog if track else None
        while True:
            try:
                # Positional, in the order jobwheel.kafka.producer gives: keyword arguments
                # cost 2.3 us a call to parse, positional ones 1.0.
                self._producer.produce(topic, value, key, partition, callback, None, 0, headers)
                return
            except BufferError:
                self._producer.poll(0.01)
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise DeliveryError(
                        f"a {len(value or b'')}-byte record for {topic} is over the size limit",
                        code=err.name(),
                    ) from exc
                raise broker_error(exc, f"producing to {topic}") from exc

    def commit(
        self, offsets: Sequence[tuple[str, int, int, str]], group_metadata: Any
    ) -> tuple[float, float]:
        """Add the consumed offsets ``(topic, partition, next offset, metadata)`` to the
        transaction and commit it; returns the seconds each of the two took (the metrics'
        transaction phases ``offsets`` and ``end``)."""
        tps = [TopicPartition(t, p, o, metadata=m) for t, p, o, m in offsets]
        began = time.perf_counter()
        if tps:
            # Not resumed: a resumed call, asked while the broker was down and pending when it
            # came back, was seen never to return (librdkafka issues 5456, 5511; the watchdog
            # then ends the process). test_scheduler_wedge: 3 hangs in 4 broker restarts when
            # resumed, none in 12 since. A new producer starts from nothing cached, and the
            # reset it takes costs a restore of the changelog's tail, not a rebalance. So a
            # call still blocked past its timeout is hung, and the watchdog ends it sooner
            # than the others (Settings.scheduler_offsets_deadline_s).
            self._resume(
                lambda: self._producer.send_offsets_to_transaction(
                    tps, group_metadata, self.timeout_s
                ),
                "send_offsets_to_transaction",
                0.0,
                self._offsets_deadline_s,
            )
        offsets_s = time.perf_counter() - began
        if self._fault_commit_delay_s:  # tests: an owner stalled with its offsets pending
            time.sleep(self._fault_commit_delay_s)
        self._resume(
            lambda: self._producer.commit_transaction(self.timeout_s),
            "commit_transaction",
            self.timeout_s * 2,
        )
        self._producer.poll(0)  # serve any delivery report commit left behind
        self.in_transaction = False
        return offsets_s, time.perf_counter() - began - offsets_s

    def abort(self) -> None:
        if not self.in_transaction:
            return
        self._resume(
            lambda: self._producer.abort_transaction(self.timeout_s),
            "abort_transaction",
            self.timeout_s * 2,
        )
        self.in_transaction = False

    def close(self) -> None:
        try:
            self._producer.flush(0)
        except (KafkaException, RuntimeError):
            pass
