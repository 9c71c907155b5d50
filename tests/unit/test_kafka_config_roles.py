"""The Kafka pass-through per kind of client and per service: each client gets the common
keys it understands, then its role's and its service's, and the keys jobwheel sets itself."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import Producer

from jobwheel.consumers.status.sink import consumer_config as sink_consumer_config
from jobwheel.consumers.worker.kafka import consumer_config as worker_consumer_config
from jobwheel.kafka.producer import producer_config
from jobwheel.settings import Settings
from jobwheel.streams import kafka as scheduler_kafka

STATIC = {"group.instance.id": "worker-0"}


def _settings(**kwargs: Any) -> Settings:
    return Settings(_env_file=None, **kwargs)  # type: ignore[call-arg]


def test_a_consumer_key_in_the_common_config_reaches_consumers_only() -> None:
    s = _settings(kafka_config={**STATIC, "security.protocol": "SSL", "linger.ms": 7})
    producer, admin = s.librdkafka("producer"), s.librdkafka("admin")
    consumer = s.librdkafka("consumer")
    assert "group.instance.id" not in producer and "group.instance.id" not in admin
    assert consumer["group.instance.id"] == "worker-0"
    assert producer["linger.ms"] == 7 and "linger.ms" not in consumer
    assert "linger.ms" not in admin
    assert {c["security.protocol"] for c in (producer, admin, consumer)} == {"SSL"}
    assert "group.instance.id" not in producer_config(s, "worker")


def test_later_layers_win_common_then_role_then_service_then_the_code() -> None:
    s = _settings(
        kafka_config={"session.timeout.ms": 1, "client.rack": "a"},
        kafka_consumer_config={"session.timeout.ms": 2, "fetch.wait.max.ms": 3},
        worker_kafka_consumer_config={"session.timeout.ms": 4, **STATIC},
        status_kafka_consumer_config={"session.timeout.ms": 5},
        kafka_producer_config={"linger.ms": 8},
        status_kafka_producer_config={"linger.ms": 9},
    )
    worker = worker_consumer_config(s)
    assert (worker["session.timeout.ms"], worker["fetch.wait.max.ms"]) == (4, 3)
    assert worker["group.instance.id"] == "worker-0" and worker["client.rack"] == "a"
    assert worker["enable.auto.commit"] is False  # the pass-through cannot change it
    sink = sink_consumer_config(s)
    assert sink["session.timeout.ms"] == 5 and "group.instance.id" not in sink
    assert producer_config(s)["linger.ms"] == 8
    assert producer_config(s, "status")["linger.ms"] == 9
    assert producer_config(s, "status", **{"linger.ms": 0})["linger.ms"] == 0


def test_every_layer_is_read_from_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JOBWHEEL_KAFKA_CONFIG", '{"client.rack": "r"}')
    monkeypatch.setenv("JOBWHEEL_KAFKA_ADMIN_CONFIG", '{"socket.timeout.ms": 1000}')
    monkeypatch.setenv("JOBWHEEL_SCHEDULER_KAFKA_CONSUMER_CONFIG", '{"fetch.min.bytes": 9}')
    monkeypatch.setenv("JOBWHEEL_SCHEDULER_KAFKA_PRODUCER_CONFIG", '{"linger.ms": 2}')
    s = Settings()
    assert s.librdkafka("admin")["socket.timeout.ms"] == 1000
    assert s.librdkafka("consumer", "scheduler")["fetch.min.bytes"] == 9
    assert "fetch.min.bytes" not in s.librdkafka("consumer", "worker")
    assert s.librdkafka("producer", "scheduler")["linger.ms"] == 2
    assert s.librdkafka("producer", "scheduler")["client.rack"] == "r"


@pytest.mark.parametrize(
    ("field", "env", "key"),
    [
        ("kafka_producer_config", "JOBWHEEL_KAFKA_PRODUCER_CONFIG", "group.instance.id"),
        ("kafka_admin_config", "JOBWHEEL_KAFKA_ADMIN_CONFIG", "acks"),
        ("worker_kafka_consumer_config", "JOBWHEEL_WORKER_KAFKA_CONSUMER_CONFIG", "linger.ms"),
    ],
)
def test_a_key_in_the_config_of_a_kind_of_client_that_does_not_understand_it_is_refused(
    field: str, env: str, key: str
) -> None:
    with pytest.raises(ValueError, match=f"{env} has keys a .* does not understand: {key}"):
        _settings(**{field: {key: "1"}})


def test_no_scheduler_consumer_takes_a_static_id_from_the_pass_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every scheduler process reads the same config: a ``group.instance.id`` there (the
    workers' static-membership key) would give two schedulers one static id, and they would
    fence each other in a loop. Static membership gives each its own instance id."""
    built: dict[str, dict[str, Any]] = {}
    monkeypatch.setattr(
        scheduler_kafka, "_client", lambda _f, config, what: built.setdefault(what, config)
    )
    s = _settings(
        kafka_config=STATIC,
        scheduler_kafka_consumer_config={"auto.offset.reset": "latest", **STATIC},
        scheduler_group_protocol="classic",
        scheduler_static_membership=True,
    )
    scheduler_kafka.InputConsumer(s, "scheduler-a")
    scheduler_kafka.AcksConsumer(s, "scheduler-a")
    scheduler_kafka.ChangelogReader(s, "scheduler-a")
    assert built["scheduler consumer"]["group.instance.id"] == "scheduler-a"
    assert "group.instance.id" not in built["acks"]
    assert "group.instance.id" not in built["changelog"]
    # An acks offset out of range restarts at the oldest ack, whatever the pass-through says.
    assert built["acks"]["auto.offset.reset"] == "earliest"

    plain = _settings(kafka_config=STATIC, scheduler_group_protocol="classic")
    built.clear()
    scheduler_kafka.InputConsumer(plain, "scheduler-b")
    assert "group.instance.id" not in built["scheduler consumer"]


def test_a_producer_built_with_a_consumer_key_in_the_common_config_does_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka logs 'is a consumer property and will be ignored by this producer' for
    each consumer key a producer is given."""
    s = _settings(bootstrap_servers="127.0.0.1:1", kafka_config={**STATIC, "log_level": 7})
    logger = logging.getLogger("test.kafka.roles")
    with caplog.at_level(logging.DEBUG, logger="test.kafka.roles"):
        producer = Producer({**producer_config(s), "logger": logger})
        producer.poll(0.2)
        del producer
    assert not [r for r in caplog.records if "consumer property" in r.getMessage()]
    assert caplog.records, "the logger saw nothing at all: the check proves nothing"


def test_every_client_gives_up_on_a_silent_broker_after_ten_seconds_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker cut off by the network answers nothing and refuses nothing: a client holds a
    request on it for ``socket.timeout.ms`` before it looks for the partition's new leader or
    the group's new coordinator. librdkafka's own 60 s made runs due in such a fault on a
    three-node cluster 54 to 62 s late; jobwheel's clients wait 10 s. Every kind of client of
    every service gets it, and the pass-through still decides."""
    built: dict[str, dict[str, Any]] = {}
    monkeypatch.setattr(
        scheduler_kafka, "_client", lambda _f, config, what: built.setdefault(what, config)
    )
    s = _settings()
    scheduler_kafka.InputConsumer(s, "scheduler-a")
    scheduler_kafka.AcksConsumer(s, "scheduler-a")
    scheduler_kafka.ChangelogReader(s, "scheduler-a")
    scheduler_kafka.TransactionalProducer(s, "scheduler-a-0")
    configs = {
        **built,
        "worker consumer": worker_consumer_config(s),
        "worker producer": producer_config(s, "worker"),
        "sink consumer": sink_consumer_config(s),
        "SDK producer": producer_config(s),
        "admin": s.librdkafka("admin"),
        "a tool's client": s.librdkafka(),
    }
    assert len(built) == 5, built.keys()  # input, acks, changelog, its end reader, producer
    assert {what: c.get("socket.timeout.ms") for what, c in configs.items()} == {
        what: 10_000 for what in configs
    }
    mine = _settings(kafka_config={"socket.timeout.ms": 30_000})
    assert worker_consumer_config(mine)["socket.timeout.ms"] == 30_000
    assert producer_config(mine)["socket.timeout.ms"] == 30_000
    assert mine.librdkafka()["socket.timeout.ms"] == 30_000


def test_a_short_transaction_timeout_shortens_the_transactional_producers_socket_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka refuses a transactional producer whose ``socket.timeout.ms`` is over its
    ``transaction.timeout.ms`` + 100 (a scheduler with a 5 s transaction timeout would not
    start); built for real here, as the scheduler builds it."""
    built: dict[str, dict[str, Any]] = {}

    def build(factory: Any, config: dict[str, Any], what: str) -> Any:
        built[what] = config
        return factory(config)

    monkeypatch.setattr(scheduler_kafka, "_client", build)
    s = _settings(bootstrap_servers="127.0.0.1:1", scheduler_transaction_timeout_ms=5_000)
    scheduler_kafka.TransactionalProducer(s, "scheduler-short-0")
    assert built["transactional producer"]["socket.timeout.ms"] == 5_000
    s = _settings(bootstrap_servers="127.0.0.1:1")
    scheduler_kafka.TransactionalProducer(s, "scheduler-default-0")
    assert built["transactional producer"]["socket.timeout.ms"] == 10_000
    mine = _settings(
        bootstrap_servers="127.0.0.1:1",
        scheduler_transaction_timeout_ms=30_000,
        scheduler_kafka_producer_config={"socket.timeout.ms": 20_000},
    )
    scheduler_kafka.TransactionalProducer(mine, "scheduler-mine-0")
    assert built["transactional producer"]["socket.timeout.ms"] == 20_000
