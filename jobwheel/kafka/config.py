"""Which librdkafka keys belong to which kind of client, and the layering of the pass-through
configs (``JOBWHEEL_KAFKA_CONFIG`` and its per-role and per-service companions).

librdkafka warns about, and ignores, a consumer key given to a producer and the reverse, and a
key meant for one process (``group.instance.id``) given to every client of every service makes
them collide: two schedulers sharing one static member id fence each other in a loop. So the
common config reaches each client filtered to the keys its kind understands, and what is meant
for one kind or one service has a config of its own (see :func:`layered`).

No ``confluent_kafka`` import here: :mod:`jobwheel.settings` builds configs with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

#: A client's kind: what librdkafka creates (an admin client is a producer handle that sends
#: admin requests, so it understands the global keys only).
Role = Literal["producer", "consumer", "admin"]
#: A jobwheel service with configs of its own (``JOBWHEEL_<SERVICE>_KAFKA_<ROLE>_CONFIG``).
Service = Literal["scheduler", "worker", "status"]
ROLES: tuple[Role, ...] = ("producer", "consumer", "admin")
SERVICES: tuple[Service, ...] = ("scheduler", "worker", "status")

#: librdkafka's consumer-only properties (``C`` in its CONFIGURATION.md, 2.16), and
#: confluent-kafka's consumer-only callback.
CONSUMER_KEYS = frozenset(
    {
        "auto.commit.enable",
        "auto.commit.interval.ms",
        "auto.offset.reset",
        "check.crcs",
        "consume.callback.max.messages",
        "consume_cb",
        "coordinator.query.interval.ms",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
        "fetch.error.backoff.ms",
        "fetch.max.bytes",
        "fetch.message.max.bytes",
        "fetch.min.bytes",
        "fetch.queue.backoff.ms",
        "fetch.wait.max.ms",
        "group.id",
        "group.instance.id",
        "group.protocol",
        "group.protocol.type",
        "group.remote.assignor",
        "heartbeat.interval.ms",
        "isolation.level",
        "max.partition.fetch.bytes",
        "max.poll.interval.ms",
        "max.poll.records",
        "offset.store.method",
        "offset.store.path",
        "offset.store.sync.interval.ms",
        "offset_commit_cb",
        "on_commit",
        "partition.assignment.strategy",
        "queued.max.messages.kbytes",
        "queued.min.messages",
        "rebalance_cb",
        "session.timeout.ms",
        "share.acknowledgement.mode",
    }
)

#: librdkafka's producer-only properties (``P`` in its CONFIGURATION.md, 2.16), and
#: confluent-kafka's producer-only callbacks.
PRODUCER_KEYS = frozenset(
    {
        "acks",
        "batch.num.messages",
        "batch.size",
        "compression.codec",
        "compression.level",
        "compression.type",
        "delivery.report.only.error",
        "delivery.timeout.ms",
        "dr_cb",
        "dr_msg_cb",
        "enable.gapless.guarantee",
        "enable.idempotence",
        "linger.ms",
        "message.send.max.retries",
        "message.timeout.ms",
        "msg_order_cmp",
        "on_delivery",
        "partitioner",
        "partitioner_cb",
        "produce.offset.report",
        "queue.buffering.backpressure.threshold",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.messages",
        "queue.buffering.max.ms",
        "queuing.strategy",
        "request.required.acks",
        "request.timeout.ms",
        "retries",
        "sticky.partitioning.linger.ms",
        "transaction.timeout.ms",
        "transactional.id",
    }
)


#: What every jobwheel client starts from, below the pass-through layers (which may change it).
#:
#: ``socket.timeout.ms``: how long a request may go unanswered before the client gives up on
#: it, closes the connection and looks up leaders and coordinators again. librdkafka's 60 s
#: default is what a broker that went silent (cut off by the network, its host frozen: it
#: accepts nothing and refuses nothing) costs every client holding a request on it. On a
#: three-node cluster a broker cut off for 30 s made runs due in the fault 52 to 62 s late:
#: the worker's offset commit to its group coordinator on the cut node waited, its heartbeats
#: queued behind it, and its session ran out. A broker that is alive answers in
#: milliseconds, and Kafka fences a silent one after 9 s, so 10 s gives up on it about when
#: its leaderships have moved. Fetches wait this plus ``fetch.wait.max.ms``; a produce, this
#: or what is left of the record's ``message.timeout.ms``, whichever is less.
CLIENT_DEFAULTS: dict[str, Any] = {"socket.timeout.ms": 10_000}


def fits(key: str, role: Role) -> bool:
    """Does a client of ``role`` understand ``key``? Unknown keys count as global."""
    if key in CONSUMER_KEYS:
        return role == "consumer"
    if key in PRODUCER_KEYS:
        return role == "producer"
    return True


def for_role(config: Mapping[str, Any], role: Role) -> dict[str, Any]:
    """The part of a common config that a client of ``role`` understands."""
    return {k: v for k, v in config.items() if fits(k, role)}


def misplaced(config: Mapping[str, Any], role: Role) -> list[str]:
    """Keys of a config meant for ``role`` that such a client does not understand."""
    return sorted(k for k in config if not fits(k, role))


def layered(
    common: Mapping[str, Any],
    role_config: Mapping[str, Any],
    service_config: Mapping[str, Any],
    role: Role,
) -> dict[str, Any]:
    """The pass-through a client of ``role`` gets, later layers winning: jobwheel's
    :data:`CLIENT_DEFAULTS`, the common config (only the keys the role understands), the
    role's, the service's role config. Keys a client sets itself (the scheduler's own
    ``group.instance.id`` and ``transactional.id``) are applied by the caller after these."""
    return {
        **for_role(CLIENT_DEFAULTS, role),
        **for_role(common, role),
        **role_config,
        **service_config,
    }
