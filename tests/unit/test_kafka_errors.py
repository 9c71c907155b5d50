"""Client-level Kafka errors in the logs: what an operator reads during a broker outage."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from jobwheel.kafka.errors import log_client_error
from jobwheel.logs import Throttle


def test_a_broker_outage_is_one_line_per_error_code_not_one_per_reconnect(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The throttle is the process's: start from a clean slate (other tests may have logged).
    (throttle,) = [
        f for f in logging.getLogger("jobwheel.kafka.errors").filters if isinstance(f, Throttle)
    ]
    monkeypatch.setattr(throttle, "_seen", {})
    refused = KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:9092 failed")
    denied = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication failed")
    with caplog.at_level(logging.WARNING, logger="jobwheel.kafka.errors"):
        for _ in range(200):
            log_client_error(refused)
        log_client_error(denied)
    lines = [r for r in caplog.records if r.name == "jobwheel.kafka.errors"]
    assert [r.code for r in lines] == ["_TRANSPORT", "_AUTHENTICATION"]  # type: ignore[attr-defined]
