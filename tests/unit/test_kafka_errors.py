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


def test_a_retry_that_heals_itself_is_not_a_warning_at_every_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka's first producer on a fresh broker warned 'Coordinator load in progress:
    retrying' on every `jobwheel up`: it is a DEBUG record now; a real failure still warns."""
    from jobwheel.logs import librdkafka_logger

    logger = librdkafka_logger("jobwheel.test-self-healing")
    healing = (
        "GETPID [jobwheel-producer#producer-1] [thrd:main]: Failed to acquire idempotence PID "
        "from broker 127.0.0.1:9092/1: Broker: Coordinator load in progress: retrying"
    )
    failing = "FAIL [jobwheel-producer#producer-1] [thrd:main]: Connection refused"
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.warning("%s", healing)
        logger.warning("%s", failing)
    assert [r.getMessage() for r in caplog.records] == [failing]
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        caplog.clear()
        logger.warning("%s", healing)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("DEBUG", healing)]
