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
