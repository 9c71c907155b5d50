"""Topics sized for the cluster they are created on, and every producer on acks=all: what a
write's durability rests on (a record is acknowledged once min.insync.replicas hold it)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from jobwheel.errors import ConfigError
from jobwheel.kafka.admin import sized_for_cluster, warn_single_replicas
from jobwheel.schemas.topics import Topics, TopicSpec
from jobwheel.settings import Settings


def _specs(replication_factor: int | None = None) -> list[TopicSpec]:
    return Topics("t", 4, replication_factor).specs()


@pytest.mark.parametrize(
    ("brokers", "factor", "min_isr"), [(1, 1, "1"), (2, 2, "1"), (3, 3, "2"), (5, 3, "2")]
)
def test_min_of_three_and_the_brokers_with_min_isr_two_from_three(
    brokers: int, factor: int, min_isr: str
) -> None:
    sized = sized_for_cluster(_specs(), brokers)
    assert {s.replication_factor for s in sized} == {factor}
    assert {s.config["min.insync.replicas"] for s in sized} == {min_isr}
    # their own kept (the workers roster is compacted)
    assert [s.config["cleanup.policy"] for s in sized] == ["delete"] * 5 + ["compact,delete"]


def test_settings_override_both() -> None:
    sized = sized_for_cluster(_specs(2), 3, min_insync_replicas=2)
    assert {(s.replication_factor, s.config["min.insync.replicas"]) for s in sized} == {(2, "2")}
    settings = Settings(_env_file=None, replication_factor=2, min_insync_replicas=1)  # type: ignore[call-arg]
    assert {s.replication_factor for s in settings.topics.specs()} == {2}
    assert Settings(_env_file=None).topics.replication_factor is None  # type: ignore[call-arg]


def test_what_the_cluster_cannot_hold_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="JOBWHEEL_REPLICATION_FACTOR"):
        sized_for_cluster(_specs(4), 3)
    with pytest.raises(ConfigError, match="JOBWHEEL_MIN_INSYNC_REPLICAS"):
        sized_for_cluster(_specs(2), 3, min_insync_replicas=3)


def test_one_replica_on_a_cluster_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jobwheel.kafka.admin"):
        warn_single_replicas(sized_for_cluster(_specs(1), 1), 1)  # nothing else is possible
        assert caplog.records == []
        warn_single_replicas(sized_for_cluster(_specs(), 3), 3)  # three replicas: no warning
        assert caplog.records == []
        sized_for_cluster(_specs(1), 3)  # sizing alone says nothing: creating does
        assert caplog.records == []
        warn_single_replicas(sized_for_cluster(_specs(1), 3), 3)
    assert len(caplog.records) == 1
    assert caplog.records[0].topics == [s.name for s in _specs()]  # type: ignore[attr-defined]


class _Recorder:
    """Stands in for confluent-kafka's Producer class only to see the config each component
    builds (no record is sent: the broker is not what is tested here)."""

    configs: list[dict[str, Any]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.configs.append(config)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: 0


def test_every_producer_waits_for_all_in_sync_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's, the worker's (acks topic) and the scheduler's transactional producer: an
    acknowledged record is on min.insync.replicas brokers, so losing the leader loses none."""
    from jobwheel.consumers.worker.kafka import StatusProducer
    from jobwheel.kafka import producer
    from jobwheel.producers.client import JobClient
    from jobwheel.streams import kafka as streams_kafka

    _Recorder.configs = []
    monkeypatch.setattr(producer, "_Producer", _Recorder)
    monkeypatch.setattr(streams_kafka, "Producer", _Recorder)
    settings = Settings(_env_file=None, bootstrap_servers="k1:9092")  # type: ignore[call-arg]
    assert JobClient(settings)._c.producer is not None  # made on first use
    status = StatusProducer(settings, **{"client.id": "jobwheel-worker"})
    status._stop.set()
    streams_kafka.TransactionalProducer(settings, "txn-1")
    assert len(_Recorder.configs) == 3
    for config in _Recorder.configs:
        assert config["acks"] == "all", config
        assert config["enable.idempotence"] is True, config
