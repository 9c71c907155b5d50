"""Topic provisioning: make the broker's topics match ``jobwheel.schemas.topics`` (idempotent).

Existing topics are never altered: a partition count that differs from the definition means
jobs would hash to other partitions (other scheduler owners, other changelog partitions), so
that is an error for a human to resolve, not something to "fix" by adding partitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from jobwheel.errors import BrokerConnectionError, BrokerError, TopicMismatchError
from jobwheel.schemas.topics import TopicSpec
from jobwheel.settings import Settings

log = logging.getLogger(__name__)


def _admin(settings: Settings):  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import AdminClient

    from jobwheel.logs import librdkafka_logger

    return AdminClient(settings.librdkafka(logger=librdkafka_logger("deploy")))


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
    if specs is None:
        t = settings.topics
        specs = [*t.specs(), *t.changelog_specs(settings.scheduler_app_id)]
    specs = list(specs)
    admin = _admin(settings)
    bootstrap = settings.bootstrap_servers
    metadata = _describe(admin, timeout_s, bootstrap)
    for spec in specs:
        existing = metadata.topics.get(spec.name)
        if existing is not None and existing.error is None:
            _check(spec, len(existing.partitions))

    missing = [s for s in specs if s.name not in metadata.topics]
    if not missing:
        return []
    # The broker's metadata can lag the controller by a moment: a topic created just now may
    # be missing above. A dry run asks the controller, so a topic that exists after all is
    # checked before anything is created (a mismatch then changes nothing).
    exists = _create(admin, missing, timeout_s, validate_only=True)
    if exists:
        _check_when_visible(admin, exists, timeout_s, bootstrap)
        missing = [s for s in missing if s not in exists]
    raced = _create(admin, missing, timeout_s, validate_only=False)
    created = [s.name for s in missing if s not in raced]
    _await_leaders(admin, [s.name for s in missing], timeout_s, bootstrap)
    if raced:  # someone else created them meanwhile: check them like the others
        _check_when_visible(admin, raced, timeout_s, bootstrap)
    if created:
        log.info("topics created", extra={"topics": created})
    return created


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
    admin = _admin(settings)
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
