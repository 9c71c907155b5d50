"""The SDK when Kafka is not there: it says so, naming the address and what to do, instead of
librdkafka's "Message timed out" after its 30 s message timeout and warnings on the way.

No broker at all (nothing listens at the address) and a real broker that goes away while a
client is using it (the test's own broker, stopped by the test)."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from jobwheel.deploy.broker import LocalBroker
from jobwheel.errors import BrokerConnectionError
from jobwheel.kafka.admin import ensure_topics
from jobwheel.producers.client import AsyncJobClient, JobClient
from jobwheel.settings import Settings


def _settings(bootstrap: str, tmp_path: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=bootstrap,
        topic_prefix="sdk",
        partitions=4,
        data_dir=tmp_path / "data",
    )


def _says_unreachable(error: BaseException, bootstrap: str) -> None:
    text = str(error)
    assert text.startswith(f"cannot reach Kafka at {bootstrap} (connection refused): "), text
    assert "is the broker running?" in text and "JOBWHEEL_BOOTSTRAP_SERVERS" in text, text


def test_with_no_broker_every_call_says_kafka_is_unreachable_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A port bound and never listened on: refused, and no other process can take it meanwhile
    # (a "free" port can be, on a machine where other tests start brokers).
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        _no_broker_at(f"127.0.0.1:{held.getsockname()[1]}", tmp_path, caplog)


def _no_broker_at(bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings(bootstrap, tmp_path)
    caplog.set_level(logging.DEBUG)
    with JobClient(settings) as client:
        with pytest.raises(BrokerConnectionError) as info:
            client.schedule(task="demo.echo", now=True)
        _says_unreachable(info.value, bootstrap)
        with pytest.raises(BrokerConnectionError):
            client.cancel("job-1")

    async def main() -> None:
        async with AsyncJobClient(settings) as client:
            with pytest.raises(BrokerConnectionError) as info:
                await client.schedule(task="demo.echo", now=True)
            _says_unreachable(info.value, bootstrap)

    asyncio.run(main())
    # No librdkafka line, no "kafka client error": the exception is all the caller gets.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


@pytest.mark.timeout(120 + 60 + 60)  # the broker's start and stop, the message timeout
def test_a_broker_that_goes_away_is_named_when_a_delivery_times_out(
    own_broker: LocalBroker, tmp_path: Path
) -> None:
    settings = _settings(own_broker.bootstrap, tmp_path)
    ensure_topics(settings)
    # The default message timeout is 30 s; a shorter one keeps the test short, same path.
    with JobClient(settings, producer_overrides={"message.timeout.ms": 3000}) as client:
        assert client.schedule(task="demo.echo", now=True)  # Kafka is there: delivered
        own_broker.stop()
        with pytest.raises(BrokerConnectionError) as info:
            client.schedule(task="demo.echo", now=True)
        _says_unreachable(info.value, own_broker.bootstrap)
        assert "; not delivered: " in str(info.value), info.value
        # ... and the next call says it before sending anything.
        with pytest.raises(BrokerConnectionError) as again:
            client.pause("job-1")
        assert "not delivered" not in str(again.value)
        _says_unreachable(again.value, own_broker.bootstrap)
