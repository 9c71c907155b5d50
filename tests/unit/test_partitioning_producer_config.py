"""The SDK's producer config is what keeps its records in the scheduler's partitions."""

from __future__ import annotations

from jobwheel.kafka.producer import producer_config
from jobwheel.settings import Settings


def _settings(**kwargs: object) -> Settings:
    return Settings(_env_file=None, bootstrap_servers="k1:9092,k2:9092", **kwargs)  # type: ignore[call-arg]


def test_defaults_are_murmur2_idempotent_and_acks_all() -> None:
    conf = producer_config(_settings())
    assert conf["partitioner"] == "murmur2_random"
    assert conf["enable.idempotence"] is True
    assert conf["acks"] == "all"
    assert conf["bootstrap.servers"] == "k1:9092,k2:9092"
    assert 0 <= conf["linger.ms"] <= 20


def test_kafka_config_pass_through_overrides_defaults_and_call_overrides_win() -> None:
    settings = _settings(
        kafka_config={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "linger.ms": 50,
            "acks": "1",
        }
    )
    conf = producer_config(settings, **{"linger.ms": 0, "client.id": "api"})
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "PLAIN"
    assert conf["acks"] == "1"  # the user asked for it
    assert conf["linger.ms"] == 0  # the call's override beats the pass-through
    assert conf["client.id"] == "api"
    assert conf["partitioner"] == "murmur2_random"
