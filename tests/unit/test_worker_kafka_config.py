"""The worker's consumer config: pass-through settings work, the guarantees cannot be undone."""

from __future__ import annotations

from jobwheel.consumers.worker.kafka import consumer_config
from jobwheel.settings import Settings


def test_pass_through_applies_but_delivery_guarantees_win() -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers="broker:9093",
        worker_group="workers-x",
        kafka_config={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "enable.auto.commit": True,
            "isolation.level": "read_uncommitted",
            "auto.offset.reset": "latest",
        },
    )
    config = consumer_config(settings)
    assert config["bootstrap.servers"] == "broker:9093"
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.mechanism"] == "PLAIN"
    assert config["group.id"] == "workers-x"
    assert config["enable.auto.commit"] is False
    assert config["enable.auto.offset.store"] is False
    assert config["isolation.level"] == "read_committed"
    assert config["auto.offset.reset"] == "latest"  # a default, so operators may change it


def test_defaults_without_pass_through() -> None:
    config = consumer_config(Settings(_env_file=None, kafka_config={}))  # type: ignore[call-arg]
    assert config["auto.offset.reset"] == "earliest"
    assert config["partition.assignment.strategy"] == "cooperative-sticky"


def test_static_members_assign_eagerly_unless_the_operator_chose_an_assignor(caplog) -> None:
    """A static member on cooperative-sticky, killed while revoking, comes back with its old
    assignment and the revoked partitions stay ownerless (test_worker_rebalance): static
    members of a classic group get ``range``; dynamic ones, and the KIP-848 protocol, keep
    theirs; an operator's explicit choice stands, with a warning if it is cooperative."""

    def built(**config: object) -> dict[str, object]:
        return consumer_config(Settings(_env_file=None, kafka_config=config))  # type: ignore[call-arg]

    assert built(**{"group.instance.id": "w-0"})["partition.assignment.strategy"] == "range"
    assert built()["partition.assignment.strategy"] == "cooperative-sticky"
    # KIP-848: the broker assigns; librdkafka refuses the classic keys, so none is sent.
    kip848 = built(**{"group.instance.id": "w-0", "group.protocol": "consumer"})
    assert not {"partition.assignment.strategy", "session.timeout.ms"} & kip848.keys()
    assert not caplog.records
    chosen = built(
        **{"group.instance.id": "w-0", "partition.assignment.strategy": "cooperative-sticky"}
    )
    assert chosen["partition.assignment.strategy"] == "cooperative-sticky"
    assert "can leave partitions unowned" in caplog.text
    roundrobin = built(
        **{"group.instance.id": "w-0", "partition.assignment.strategy": "roundrobin"}
    )
    assert roundrobin["partition.assignment.strategy"] == "roundrobin"
