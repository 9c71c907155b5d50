"""Topic and group administration: make the broker's topics match ``jobwheel.schemas.topics``
(idempotent), give the scheduler group its timing, and the admin client of every command.

Existing topics are never altered: a partition count that differs from the definition means
jobs would hash to other partitions (other scheduler owners, other changelog partitions), so
that is an error for a human to resolve, not something to "fix" by adding partitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jobwheel.errors import BrokerConnectionError, BrokerError, ConfigError, TopicMismatchError
from jobwheel.kafka.errors import broker_error
from jobwheel.schemas import progress
from jobwheel.schemas.topics import TopicSpec
from jobwheel.settings import Settings

log = logging.getLogger(__name__)


def admin_client(settings: Settings, package: str = "jobwheel.kafka"):  # type: ignore[no-untyped-def]
    """An ``AdminClient`` of ``settings`` whose librdkafka lines go to ``<package>.librdkafka``."""
    from confluent_kafka.admin import AdminClient

    from jobwheel.logs import librdkafka_logger

    return AdminClient(settings.librdkafka("admin", logger=librdkafka_logger(package)))


def _describe(admin, timeout_s: float, bootstrap: str):  # type: ignore[no-untyped-def]
    from confluent_kafka import KafkaException

    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerConnectionError(
            f"could not reach Kafka at {bootstrap} within {timeout_s:.0f}s ({exc.args[0]}): "
            "start a local broker with `jobwheel broker start` (or `make run`), or point "
            "JOBWHEEL_BOOTSTRAP_SERVERS at a running one",
            code="TRANSPORT",
        ) from exc


def _mismatch_message(spec: TopicSpec, actual: int) -> str:
    return (
        f"topic {spec.name} has {actual} partitions but jobwheel expects {spec.partitions}: "
        "requests, runs, acks and status must be co-partitioned with the configured count. "
        "Either delete the topic (losing its records; e.g. Kafka's kafka-topics.sh --delete "
        f"--topic {spec.name}, or for the local broker `jobwheel broker stop` and remove its "
        "data dir) and run `jobwheel topics ensure` again, or set "
        f"JOBWHEEL_PARTITIONS={actual} to use the existing layout"
    )


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic of a deployment: the prefix's topics and the scheduler's changelog, whose
    name comes from the scheduler's application id, not from the prefix. What
    :func:`ensure_topics` creates and what its callers count, from this one list."""
    t = settings.topics
    return [*t.specs(), *t.changelog_specs(settings.scheduler_app_id)]


def topics_summary(settings: Settings, created: Sequence[str]) -> str:
    """One line on what :func:`ensure_topics` found: how many topics, which, how many it
    created. Counting the prefix's topics alone read "5 with prefix jobwheel (6 created)"."""
    total = len(topic_specs(settings))
    made = len(created)
    news = (
        "all created now"
        if made == total
        else "all there already"
        if made == 0
        else f"{made} created now, {total - made} there already"
    )
    return (
        f"{total} topics, {news} (prefix {settings.topic_prefix}, and the scheduler's "
        f"changelog {settings.topics.changelog(settings.scheduler_app_id)})"
    )


def ensure_topics(
    settings: Settings,
    specs: Sequence[TopicSpec] | None = None,
    *,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create the missing topics of ``settings`` and return their names.

    Raises :class:`TopicMismatchError` (before creating anything) when an existing topic has a
    different partition count; safe to run concurrently with another ``ensure_topics``.
    """
    specs = list(topic_specs(settings) if specs is None else specs)
    admin = admin_client(settings)
    bootstrap = settings.bootstrap_servers
    metadata = _describe(admin, timeout_s, bootstrap)
    for spec in specs:
        existing = metadata.topics.get(spec.name)
        if existing is not None and existing.error is None:
            _check(spec, len(existing.partitions))

    missing = [s for s in specs if s.name not in metadata.topics]
    if not missing:
        return []
    missing = sized_for_cluster(missing, len(metadata.brokers), settings.min_insync_replicas)
    # The broker's metadata can lag the controller by a moment: a topic created just now may
    # be missing above. A dry run asks the controller, so a topic that exists after all is
    # checked before anything is created (a mismatch then changes nothing).
    exists = _create(admin, missing, timeout_s, validate_only=True)
    if exists:
        _check_when_visible(admin, exists, timeout_s, bootstrap)
        missing = [s for s in missing if s not in exists]
    raced = _create(admin, missing, timeout_s, validate_only=False)
    created = [s.name for s in missing if s not in raced]
    warn_single_replicas([s for s in missing if s not in raced], len(metadata.brokers))
    _await_leaders(admin, [s.name for s in missing], timeout_s, bootstrap)
    if raced:  # someone else created them meanwhile: check them like the others
        _check_when_visible(admin, raced, timeout_s, bootstrap)
    if created:
        log.info("topics created", extra={"topics": created})
    return created


def sized_for_cluster(
    specs: Sequence[TopicSpec], brokers: int, min_insync_replicas: int | None = None
) -> list[TopicSpec]:
    """``specs`` with their replication decided for a cluster of ``brokers`` brokers.

    A spec without a replication factor gets min(3, brokers); every spec gets
    ``min.insync.replicas`` (``min_insync_replicas``, else 2 from 3 replicas on, else 1)
    unless its config has one. With producers on acks=all, a record is acknowledged only
    once that many replicas hold it, so losing one broker loses no acknowledged job, and
    writes go on while one broker is down. Factors the cluster cannot hold are refused here,
    naming the setting, rather than by the broker mid-way. Creating RF 1 topics on a cluster
    is allowed (a setting asked for it); :func:`warn_single_replicas` says so for those
    actually created.
    """
    out: list[TopicSpec] = []
    for spec in specs:
        factor = spec.replication_factor or min(3, max(1, brokers))
        if factor > brokers:
            raise ConfigError(
                f"topic {spec.name} needs replication factor {factor} but the cluster has "
                f"{brokers} broker(s) up: lower JOBWHEEL_REPLICATION_FACTOR (or unset it for "
                "min(3, brokers)), or start the missing brokers"
            )
        config = dict(spec.config)
        if "min.insync.replicas" not in config:
            config["min.insync.replicas"] = str(min_insync_replicas or (2 if factor >= 3 else 1))
        if int(config["min.insync.replicas"]) > factor:
            raise ConfigError(
                f"topic {spec.name}: min.insync.replicas {config['min.insync.replicas']} is "
                f"more than its {factor} replicas, so no write could ever be acknowledged: "
                "lower JOBWHEEL_MIN_INSYNC_REPLICAS or raise JOBWHEEL_REPLICATION_FACTOR"
            )
        out.append(TopicSpec(spec.name, spec.partitions, factor, config))
    return out


def warn_single_replicas(created: Sequence[TopicSpec], brokers: int) -> None:
    """One warning for the topics just created with one replica on a cluster: one broker's
    loss then loses jobs. Only for topics created here: the metadata can miss topics created
    a moment ago, and warning for those (which a dry run then finds) warned twice."""
    single = [s.name for s in created if s.replication_factor == 1]
    if single and brokers > 1:
        log.warning(
            "creating topics with one replica on a cluster: losing one broker loses their "
            "records (scheduled jobs, runs, state)",
            extra={
                "topics": single,
                "brokers": brokers,
                "fix": "unset JOBWHEEL_REPLICATION_FACTOR (min(3, brokers) is used) before "
                "the topics are created; an existing topic keeps its replicas",
            },
        )


def _create(  # type: ignore[no-untyped-def]
    admin, specs: list[TopicSpec], timeout_s: float, *, validate_only: bool
) -> list[TopicSpec]:
    """CreateTopics for ``specs``; returns those that already exist, raises other errors."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    if not specs:
        return []
    futures = admin.create_topics(
        [
            NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.config))
            for s in specs
        ],
        request_timeout=timeout_s,
        operation_timeout=timeout_s,
        validate_only=validate_only,
    )
    exists: list[TopicSpec] = []
    for spec in specs:
        try:
            futures[spec.name].result()
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                exists.append(spec)
                continue
            raise BrokerError(
                f"creating topic {spec.name} failed: {err.str()}", code=err.name()
            ) from exc
    return exists


def _check_when_visible(  # type: ignore[no-untyped-def]
    admin, specs: list[TopicSpec], timeout_s: float, bootstrap: str
) -> None:
    _await_leaders(admin, [s.name for s in specs], timeout_s, bootstrap)
    metadata = _describe(admin, timeout_s, bootstrap)
    for spec in specs:
        topic = metadata.topics.get(spec.name)
        if topic is not None and topic.error is None:
            _check(spec, len(topic.partitions))


def _check(spec: TopicSpec, actual: int) -> None:
    if actual != spec.partitions:
        raise TopicMismatchError(_mismatch_message(spec, actual), code="PARTITION_COUNT")


def _await_leaders(admin, names: list[str], timeout_s: float, bootstrap: str) -> None:  # type: ignore[no-untyped-def]
    """Return once every partition of ``names`` has a leader in the broker's metadata.

    CreateTopics returns when the controller committed the topic; the broker serving
    metadata may lag a moment, and a client produced to the topic in that moment would
    see UNKNOWN_TOPIC_OR_PART.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = _describe(admin, timeout_s, bootstrap)
        ready = all(
            (topic := metadata.topics.get(name)) is not None
            and topic.error is None
            and topic.partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
            for name in names
        )
        if ready or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def configure_scheduler_group(settings: Settings, *, timeout_s: float = 30.0) -> bool:
    """Give the scheduler group its session and heartbeat timing as group configs (KIP-848).

    With the ``consumer`` group protocol these live on the broker, and a stock broker's
    defaults (45 s session) would leave a dead scheduler's partitions unowned for 45 s. Returns
    False (and logs what to change) when the broker refuses, e.g. because its
    ``group.consumer.min.session.timeout.ms`` is above the wanted value; the scheduler then
    runs with the broker's defaults.
    """
    if settings.scheduler_group_protocol != "consumer":
        return True  # classic: the client sends its own session timeout
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    wanted = {
        "consumer.session.timeout.ms": str(settings.scheduler_session_timeout_ms),
        "consumer.heartbeat.interval.ms": str(settings.scheduler_heartbeat_interval_ms),
    }
    resource = ConfigResource(
        ResourceType.GROUP,
        settings.scheduler_app_id,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in wanted.items()
        ],
    )
    admin = admin_client(settings)
    try:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout_s)
    except KafkaException as exc:
        log.warning(
            "the broker refused the scheduler group's timing; using the broker's defaults",
            extra={
                "group": settings.scheduler_app_id,
                "wanted": wanted,
                "error": str(exc.args[0] if exc.args else exc),
                "fix": "allow it with the broker's group.consumer.min.session.timeout.ms / "
                "group.consumer.min.heartbeat.interval.ms, or set JOBWHEEL_SCHEDULER_SESSION_"
                "TIMEOUT_MS within the broker's bounds",
            },
        )
        return False
    return True


@dataclass(frozen=True, slots=True)
class GroupMember:
    client_id: str
    host: str
    member_id: str
    #: ``(topic, partition)`` pairs assigned to the member.
    assigned: tuple[tuple[str, int], ...]


def describe_group(
    settings: Settings, group: str, timeout_s: float, package: str = "jobwheel.kafka"
) -> tuple[str, list[GroupMember]]:
    """The group's state name and members; raises :class:`BrokerError`. Asked from a child
    process (:mod:`jobwheel.kafka.groupprobe`: librdkafka's group-coordinator requests can
    abort the process that makes them while the broker restarts). ``package`` is kept for
    the callers' symmetry with the other reads; the child logs nothing."""
    from jobwheel.kafka import groupprobe

    answer = groupprobe.describe(settings.librdkafka("admin"), group, timeout_s)
    members = [
        GroupMember(
            m["client_id"],
            m["host"],
            m["member_id"],
            tuple((topic, int(p)) for topic, p in m["assigned"]),
        )
        for m in answer["members"]
    ]
    return str(answer["state"]), members


@dataclass(frozen=True, slots=True)
class InputProgress:
    """One scheduler partition as the group's committed offsets tell it: the latest progress
    note, the input records (requests and acks) not committed past, and the broker timestamp
    of the oldest of them (None when nothing waits, or it was not looked at or not read)."""

    note: progress.Progress | None
    unread: int
    waiting_since_ms: int | None = None


def scheduler_progress(
    settings: Settings, timeout_s: float, package: str = "jobwheel.kafka"
) -> dict[int, InputProgress]:
    """Per partition: the scheduler's latest progress note (in its committed offsets, see
    :mod:`jobwheel.schemas.progress`), how many input records it has not committed past (a
    requests partition it never committed counts whole), and, where input waits with no
    commit for ``JOBWHEEL_HEALTH_STUCK_AFTER_MS``, the broker timestamp of the oldest unread
    record, which a stall is timed from.

    Read by a consumer that never joins the group (committed offsets, end offsets, the oldest
    unread records), not by the admin client's group-coordinator requests: those went through
    librdkafka's coordinator-request path, which has aborted processes polling it through
    broker restarts (librdkafka issues 3663 and 4605), and their handle was destroyed with a
    request still pending whenever an answer timed out. Raises :class:`BrokerError`."""
    from confluent_kafka import KafkaException, TopicPartition

    from jobwheel.kafka.consumer import ask_watermarks

    t = settings.topics
    topics = (t.requests, t.acks)
    left = _time_left(timeout_s, "reading the scheduler group's offsets")
    consumer = _offsets_reader(settings, settings.scheduler_app_id, package)
    try:
        tps = [TopicPartition(topic, p) for topic in topics for p in range(t.partitions)]
        committed = {(tp.topic, tp.partition): tp for tp in consumer.committed(tps, left())}
        marks = {
            (tp.topic, tp.partition): ask_watermarks(consumer, tp.topic, tp.partition, left())
            for tp in tps
        }
        now = time.time_ns() // 1_000_000
        out, starts = _partition_progress(settings, committed, marks, now)
        oldest, _ = _first_records(consumer, starts, left)
    except KafkaException as exc:
        raise broker_error(exc, "reading the scheduler group's offsets") from exc
    finally:
        consumer.close()
    for (_topic, p), ts in oldest.items():
        found = out[p]
        since = ts if found.waiting_since_ms is None else min(ts, found.waiting_since_ms)
        out[p] = InputProgress(found.note, found.unread, since)
    return out


def _time_left(timeout_s: float, what: str) -> Any:
    """A callable giving the seconds left of ``timeout_s`` from now; raises
    :class:`BrokerConnectionError` naming ``what`` once none are."""
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerConnectionError(f"{what} took over {timeout_s:g}s", code="_TIMED_OUT")
        return remaining

    return left


def _offsets_reader(settings: Settings, group: str, package: str, *, eof: bool = False) -> Any:
    """A consumer that reads ``group``'s committed offsets and never joins it (so it never
    takes a partition from a member); ``eof``: it says when a partition has no more records."""
    from confluent_kafka import Consumer

    from jobwheel.kafka.errors import with_client_logging

    config = settings.librdkafka(
        "consumer",
        **{
            "group.id": group,  # whose committed offsets; never joins
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": eof,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        },
    )
    config.pop("group.instance.id", None)  # never a member, so never a static one
    return Consumer(with_client_logging(config, package))


@dataclass(frozen=True, slots=True)
class Backlog:
    """One partition of a worker pool's runs topic as its group's committed offsets tell it:
    the runs past the committed offset (waiting, or running: a worker commits a partition up
    to its oldest unfinished run) and the broker timestamp of the first of them (None when
    none is past it, or it was not read in time)."""

    unfinished: int
    oldest_ms: int | None = None


def group_backlog(
    settings: Settings, group: str, topic: str, timeout_s: float, package: str = "jobwheel.kafka"
) -> dict[int, Backlog]:
    """Per partition of ``topic``: what ``group`` has not committed past (a partition it never
    committed counts whole, as its members start from the earliest offset) and when the oldest
    of it was written. Read like :func:`scheduler_progress`, by a consumer that never joins.

    Offsets count transaction markers too (the scheduler writes runs in transactions, and a
    worker commits past the last run it fetched, not past the marker after it): a partition
    whose offsets past the commit hold no record is read to its end and counts 0; elsewhere
    the count is an upper bound by the markers in between (one per scheduler transaction that
    wrote to the partition). Raises :class:`BrokerError`."""
    from confluent_kafka import KafkaException, TopicPartition

    from jobwheel.kafka.consumer import ask_watermarks

    left = _time_left(timeout_s, f"reading the offsets of the group {group}")
    consumer = _offsets_reader(settings, group, package, eof=True)
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, left())}
        starts: dict[tuple[str, int], int] = {}
        unfinished: dict[int, int] = {}
        for tp in tps:
            low, end = ask_watermarks(consumer, topic, tp.partition, left())
            start = committed.get(tp.partition, -1)
            start = start if start >= 0 else low
            unfinished[tp.partition] = max(0, end - start)
            if end > start:
                starts[(topic, tp.partition)] = start
        oldest, empty = _first_records(consumer, starts, left)
    except KafkaException as exc:
        raise broker_error(exc, f"reading the offsets of the group {group}") from exc
    finally:
        consumer.close()
    return {
        p: Backlog(0 if (topic, p) in empty else n, oldest.get((topic, p)))
        for p, n in unfinished.items()
    }


def _first_records(  # type: ignore[no-untyped-def]
    consumer, starts: dict[tuple[str, int], int], left
) -> tuple[dict[tuple[str, int], int], set[tuple[str, int]]]:
    """From each start offset: the timestamp of the first record, or the partition's end
    reached with none (only transaction markers: told only by a ``consumer`` with
    ``enable.partition.eof`` on); as many as arrive before the deadline."""
    from confluent_kafka import KafkaError, TopicPartition

    if not starts:
        return {}, set()
    consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
    found: dict[tuple[str, int], int] = {}
    empty: set[tuple[str, int]] = set()
    try:
        while len(found) + len(empty) < len(starts):
            for msg in consumer.consume(len(starts), min(0.5, left())):
                key = (msg.topic(), msg.partition())
                if key not in starts or key in found or key in empty:
                    continue
                error = msg.error()
                if error is None:
                    found[key] = msg.timestamp()[1]
                elif error.code() == KafkaError._PARTITION_EOF:
                    empty.add(key)
    except BrokerConnectionError:
        pass  # out of time: what was not read stays unknown
    return found, empty


def _partition_progress(
    settings: Settings,
    committed: dict[tuple[str, int], Any],
    marks: dict[tuple[str, int], tuple[int, int]],
    now: int,
) -> tuple[dict[int, InputProgress], dict[tuple[str, int], int]]:
    """Each partition's latest progress note and unread input, from the group's committed
    offsets and the end offsets; and, where input waits with no commit for the stuck
    threshold, the first unread offset of each input (whose oldest record times the stall).
    Kept apart from the reading in :func:`scheduler_progress`: no Kafka call in here."""
    t = settings.topics
    topics = (t.requests, t.acks)
    out: dict[int, InputProgress] = {}
    starts: dict[tuple[str, int], int] = {}  # suspects: the first unread offset
    for p in range(t.partitions):
        notes: list[progress.Progress] = []
        unread = 0
        waiting: dict[tuple[str, int], int] = {}
        for topic in topics:
            low, end = marks[(topic, p)]
            tp = committed.get((topic, p))
            if tp is not None and tp.offset >= 0:
                unread_here, start = max(0, end - tp.offset), tp.offset
                note = progress.decode(tp.metadata)
                if note is not None:
                    notes.append(note)
            elif topic == t.requests:  # never committed: all of it is unread
                unread_here, start = max(0, end - low), low
            else:
                continue
            unread += unread_here
            if unread_here:
                waiting[(topic, p)] = start
        latest = max(notes, key=lambda n: n.committed_at_ms, default=None)
        silent = None if latest is None else now - latest.committed_at_ms
        if waiting and (silent is None or silent >= settings.health_stuck_after_ms):
            starts.update(waiting)
        out[p] = InputProgress(latest, unread)
    return out, starts


# --- principals and ACLs (deploy/acls.py decides what each role may do) ----------------------


class AclGrant(Protocol):
    """Operations allowed on resources of one kind named ``name`` (or starting with it)."""

    resource: str  # TOPIC | GROUP | TRANSACTIONAL_ID
    name: str
    operations: tuple[str, ...]
    prefixed: bool


def _bindings(principal: str, grants: Iterable[AclGrant]) -> list[Any]:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return [
        AclBinding(
            ResourceType[g.resource],
            g.name,
            ResourcePatternType.PREFIXED if g.prefixed else ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation[op],
            AclPermissionType.ALLOW,
        )
        for g in grants
        for op in g.operations
    ]


def _key(binding: Any) -> tuple[str, ...]:
    return (
        binding.restype.name,
        binding.name,
        binding.resource_pattern_type.name,
        binding.principal,
        binding.host,
        binding.operation.name,
        binding.permission_type.name,
    )


def upsert_scram_user(
    admin: Any, user: str, password: str, iterations: int, timeout_s: float
) -> None:
    """Create the SCRAM-SHA-512 user, or change its password. Raises :class:`BrokerError`."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, iterations)
    upsert = UserScramCredentialUpsertion(user, info, password.encode())
    try:
        admin.alter_user_scram_credentials([upsert])[user].result(timeout=timeout_s)
    except KafkaException as exc:
        raise broker_error(exc, f"setting the credentials of {user}") from exc


def replace_acls(
    admin: Any, principal: str, grants: Iterable[AclGrant], timeout_s: float
) -> tuple[int, int]:
    """Make the principal's ACLs exactly ``grants`` (ALLOW, any host): returns how many it
    holds and how many held ones were revoked. Raises :class:`BrokerError`."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    wanted = {_key(b): b for b in _bindings(principal, grants)}
    held_filter = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        principal,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    try:
        held = admin.describe_acls(held_filter, request_timeout=timeout_s).result(timeout=timeout_s)
        extra = [b for b in held if _key(b) not in wanted]
        if extra:
            filters = [
                AclBindingFilter(
                    b.restype,
                    b.name,
                    b.resource_pattern_type,
                    b.principal,
                    b.host,
                    b.operation,
                    b.permission_type,
                )
                for b in extra
            ]
            for future in admin.delete_acls(filters, request_timeout=timeout_s).values():
                future.result(timeout=timeout_s)
        for future in admin.create_acls(list(wanted.values()), request_timeout=timeout_s).values():
            future.result(timeout=timeout_s)
    except KafkaException as exc:
        raise broker_error(exc, f"setting the ACLs of {principal}") from exc
    return len(wanted), len(extra)


def metadata_answers(config: dict[str, Any], timeout_s: float) -> bool:
    """Does a broker of ``config`` answer a metadata request within ``timeout_s``? Quiet:
    asked in a loop while a broker starts, whose refusals are expected."""
    return bool(live_brokers(config, timeout_s))


def live_brokers(config: dict[str, Any], timeout_s: float) -> frozenset[int]:
    """The ids of the brokers a metadata answer of ``config`` lists (registered and not
    fenced); empty when nothing answers within ``timeout_s``. Quiet, like
    :func:`metadata_answers`: asked in a loop while the brokers of a cluster start."""
    from confluent_kafka.admin import AdminClient

    quiet = logging.getLogger("jobwheel.kafka.probe.librdkafka")
    quiet.setLevel(logging.CRITICAL)
    admin = AdminClient({**config, "logger": quiet})
    try:
        return frozenset(admin.list_topics(timeout=timeout_s).brokers)
    except Exception:
        return frozenset()
