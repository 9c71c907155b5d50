"""All configuration, read from ``JOBWHEEL_*`` environment variables in this one place.

Kafka client options are passed through untouched as dicts, so SASL/TLS and any other
librdkafka (confluent-kafka) or aiokafka (faust) setting works without a code change:

    JOBWHEEL_KAFKA_CONFIG='{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", ...}'
    JOBWHEEL_FAUST_CONFIG='{"broker_credentials": ...}'   # extra faust.App settings
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.topics import (
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    DEFAULT_REPLICATION_FACTOR,
    Topics,
)


class Settings(BaseSettings):
    """Frozen settings; build one with :func:`get_settings` (or ``Settings()`` in tests)."""

    model_config = SettingsConfigDict(env_prefix="JOBWHEEL_", frozen=True, extra="ignore")

    # Kafka
    # Default: the local broker of `jobwheel broker start` / `jobwheel up` (its broker_port).
    bootstrap_servers: str = ""
    kafka_config: dict[str, Any] = Field(default_factory=dict)
    topic_prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = DEFAULT_REPLICATION_FACTOR
    schema_registry_url: str | None = None

    # Local state (faust RocksDB tables, embedded ClickHouse, local broker)
    data_dir: Path = Path(".jobwheel")

    # Local broker (deploy/)
    broker_port: int = 9092
    broker_controller_port: int = 9093
    broker_heap: str = "512m"

    # Scheduler (streams/)
    scheduler_app_id: str = "jobwheel-scheduler"
    tick_interval_ms: int = 20
    dispatch_batch_limit: int = 2000
    # A completed or cancelled job's record is kept this long, then deleted from the state.
    job_retention_ms: int = 24 * 3600 * 1000
    faust_config: dict[str, Any] = Field(default_factory=dict)
    rocksdb_block_cache_bytes: int = 8 * 1024 * 1024

    # Workers (consumers/)
    worker_group: str = "jobwheel-workers"
    worker_concurrency: int = 8
    # SIGTERM: how long in-flight runs may finish before they are handed back (FAILED, retry 0).
    # Keep it below the orchestrator's kill timeout (Kubernetes: 30 s by default).
    worker_shutdown_grace_ms: int = 25_000
    # A run still executing after this long gets its own STARTED event; a quicker one only its
    # SUCCEEDED/FAILED, which carries the start (started_ms). 0: STARTED before every run.
    worker_started_event_ms: int = 100
    # How often finished work's offsets are committed: a SIGKILLed worker's runs finished since
    # the last commit are delivered (and executed) again by the next owner of the partition.
    worker_commit_interval_ms: int = 100

    # Status (consumers/status)
    clickhouse_url: str | None = None
    status_group: str = "jobwheel-status"
    status_ttl_days: int = 30
    clickhouse_database: str = "jobwheel"
    status_batch_size: int = 20_000
    status_batch_ms: int = 500
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_url: str | None = None

    # Producer limits
    max_args_bytes: int = 64 * 1024

    # Logging
    log_level: str = "INFO"
    log_format: str = "json"

    @model_validator(mode="after")
    def _default_bootstrap(self) -> Settings:
        if not self.bootstrap_servers:
            object.__setattr__(self, "bootstrap_servers", f"127.0.0.1:{self.broker_port}")
        return self

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix, self.partitions, self.replication_factor)

    @property
    def clickhouse_dsn(self) -> str:
        """The ClickHouse URL; embedded chdb in the data dir unless a server URL is set."""
        if self.clickhouse_url:
            return self.clickhouse_url
        return f"chdb://{(self.data_dir / 'clickhouse').resolve()}"

    @property
    def status_api_url(self) -> str:
        return self.api_url or f"http://{self.api_host}:{self.api_port}"

    def librdkafka(self, **overrides: Any) -> dict[str, Any]:
        """A confluent-kafka config: bootstrap servers, the pass-through dict, then overrides."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka_config, **overrides}


@functools.cache
def get_settings() -> Settings:
    return Settings()
