"""All configuration, read from ``JOBWHEEL_*`` environment variables in this one place.

Kafka client options are passed through as dicts, so SASL/TLS and any other librdkafka
(confluent-kafka) setting works without a code change. ``JOBWHEEL_KAFKA_CONFIG`` is common to
every client (connection and security); each client gets only the keys its kind understands
(a consumer key never reaches a producer). Keys for one kind of client go in
``JOBWHEEL_KAFKA_{PRODUCER,CONSUMER,ADMIN}_CONFIG``, keys for one service's clients in
``JOBWHEEL_{SCHEDULER,WORKER,STATUS}_KAFKA_{PRODUCER,CONSUMER}_CONFIG`` (later ones win; see
:meth:`Settings.librdkafka` and jobwheel/kafka/config.py):

    JOBWHEEL_KAFKA_CONFIG='{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", ...}'
    JOBWHEEL_WORKER_KAFKA_CONSUMER_CONFIG='{"group.instance.id": "worker-0"}'
"""

from __future__ import annotations

import functools
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobwheel.errors import ConfigError
from jobwheel.kafka import config as kafka_keys
from jobwheel.schemas.topics import (
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    DEFAULT_QUEUE,
    DEFAULT_REPLICATION_FACTOR,
    Topics,
)

#: What ``send_offsets_to_transaction`` gets past its own timeout before the watchdog calls it
#: hung (``Settings.scheduler_offsets_deadline_s``): its requests to the transaction and group
#: coordinators answer in milliseconds when they answer, and the timeout covers finding them.
OFFSETS_DEADLINE_MARGIN_S = 5.0


def jvm_options(text: str) -> tuple[str, ...]:
    """``JOBWHEEL_BROKER_JVM_OPTIONS`` as arguments. Each must be an option (``-...``): a word
    that is none would become the JVM's main class and the broker would not start; the class
    path and main class are jobwheel's to give."""
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise ValueError(f"JVM options a shell could split ({exc})") from exc
    for word in words:
        if not word.startswith("-"):
            raise ValueError(
                "JVM options separated by spaces, each starting with '-' (e.g. "
                f"-XX:TieredStopAtLevel=1 -Xlog:gc): {word!r} is not one"
            )
        if word in ("-cp", "-classpath", "--class-path", "-jar"):
            raise ValueError(
                f"JVM options other than {word} (the class path and main class are "
                "jobwheel's to give)"
            )
    return words


class Settings(BaseSettings):
    """Frozen settings; build one with :func:`get_settings` (or ``Settings()`` in tests)."""

    model_config = SettingsConfigDict(env_prefix="JOBWHEEL_", frozen=True, extra="ignore")

    # Kafka
    # Default: the local broker of `jobwheel broker start` / `jobwheel up` (its broker_port).
    bootstrap_servers: str = ""
    # Common to every client; each kind gets the keys it understands (see the module doc).
    kafka_config: dict[str, Any] = Field(default_factory=dict)
    # Per kind of client, then per service and kind; later layers win.
    kafka_producer_config: dict[str, Any] = Field(default_factory=dict)
    kafka_consumer_config: dict[str, Any] = Field(default_factory=dict)
    kafka_admin_config: dict[str, Any] = Field(default_factory=dict)
    scheduler_kafka_producer_config: dict[str, Any] = Field(default_factory=dict)
    scheduler_kafka_consumer_config: dict[str, Any] = Field(default_factory=dict)
    worker_kafka_producer_config: dict[str, Any] = Field(default_factory=dict)
    worker_kafka_consumer_config: dict[str, Any] = Field(default_factory=dict)
    status_kafka_producer_config: dict[str, Any] = Field(default_factory=dict)
    status_kafka_consumer_config: dict[str, Any] = Field(default_factory=dict)
    topic_prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    # Replicas of each topic `topics ensure` creates; unset: min(3, brokers in the cluster).
    replication_factor: int | None = Field(default=DEFAULT_REPLICATION_FACTOR, ge=1)
    # min.insync.replicas of the topics it creates; unset: 2 with 3+ replicas, else 1. With
    # acks=all a write is acknowledged once this many replicas have it.
    min_insync_replicas: int | None = Field(default=None, ge=1)
    schema_registry_url: str | None = None

    # Local state (scheduler RocksDB state, embedded ClickHouse, local broker, stack logs).
    # Per user, not per folder: `jobwheel broker status` or `jobwheel up` from any folder find
    # the same stack. Always absolute (a relative value is resolved once, against the folder
    # the process starts in), so every message shows where it looked.
    data_dir: Path = Field(default_factory=lambda: default_data_dir())

    # `jobwheel acls apply`: each role's SCRAM password, e.g. {"worker": "..."} (a role not
    # given keeps the password an earlier run wrote, or gets a generated one).
    kafka_role_passwords: dict[str, SecretStr] = Field(default_factory=dict)
    # where `jobwheel acls apply` writes each role's JOBWHEEL_KAFKA_CONFIG (default: in data_dir)
    kafka_credentials_dir: Path | None = None

    # Local broker (deploy/)
    broker_port: int = 9092
    broker_controller_port: int = 9093
    broker_heap: str = "512m"
    # More options for the local broker's JVM, split as a shell would: e.g.
    # "-XX:TieredStopAtLevel=1", the test suite's, whose brokers live for minutes (a fresh
    # JVM's optimising compiler is half its CPU there; a long-lived broker keeps the default).
    broker_jvm_options: str = ""

    # Scheduler (streams/)
    # The consumer group, the prefix of the transactional ids and of the changelog topic.
    scheduler_app_id: str = "jobwheel-scheduler"
    # "consumer" (KIP-848, partitions move in about a second) or "classic" (cooperative-sticky).
    scheduler_group_protocol: Literal["consumer", "classic"] = "consumer"
    # A scheduler that stops heartbeating (killed, frozen) loses its partitions after this.
    # Classic protocol: the client's session timeout; KIP-848: set as the group's own config
    # (the broker's group.consumer.min/max.session.timeout.ms must allow it).
    scheduler_session_timeout_ms: int = 6_000
    scheduler_heartbeat_interval_ms: int = 1_000
    # Static group membership (classic protocol only): a restarted instance takes its
    # partitions back at once, but a stopped one holds them until the session times out.
    scheduler_static_membership: bool = False
    # Upper bound of one transaction's lifetime: a killed scheduler's open transaction holds
    # back read_committed readers of its partitions this long at most.
    scheduler_transaction_timeout_ms: int = 10_000
    # How far the scheduler trusts a clock that is not the broker's (its host's, a client's
    # issue time) away from the broker's time as it reads it (LogAppendTime of the requests
    # and acks): "now" and a command's issue time are clamped to within this of it.
    scheduler_clock_tolerance_ms: int = Field(default=2_000, ge=0)
    # How far ahead of the broker's time as last read (advanced by the monotonic clock) the
    # scheduler's own clock may put "now": a step of its host's clock forward makes at most
    # this much of fires due at once. Above the read's latency (a held fetch).
    scheduler_clock_step_tolerance_ms: int = Field(default=10_000, ge=0)
    # A blocking transactional call (init, send offsets, commit, abort; each is given the
    # transaction timeout, at least 5 s) still running this long after it began is hung
    # (librdkafka issues 5456, 5511: some ignore their timeout): the scheduler logs it and
    # exits with code 75 for its supervisor to restart it (see jobwheel.watchdog). 0: three
    # times the call's timeout (30 s with the default transaction timeout), and for
    # send_offsets_to_transaction, never resumed, its timeout and 5 s (15 s; see
    # scheduler_offsets_deadline_s). Set, it is every call's deadline.
    scheduler_call_deadline_ms: int = Field(default=0, ge=0)
    # A partition whose changelog could not be measured, or was read no further while
    # restoring, for this long gets a new changelog consumer (a client's stale metadata, e.g.
    # "no leader" cached during a broker restart, otherwise holds it "restoring" for minutes).
    # A claim that cannot read its committed offsets or rewind its input this long (and at
    # least the transaction timeout + 15 s), with Kafka reachable, gets every client replaced
    # and joins the group again (scheduler_claim_stall_s).
    scheduler_restore_stall_ms: int = Field(default=30_000, ge=1_000)
    # The transactional producer is replaced by a new one when it could not register
    # (init_transactions) for this long: a new client looks its coordinator up afresh.
    scheduler_init_fresh_after_ms: int = Field(default=60_000, ge=1_000)
    # Under load, loop iterations share one transaction for at most this long (fewer, larger
    # transactions); outputs become visible when it commits, so it adds up to this to a fire.
    scheduler_commit_interval_ms: int = Field(default=25, ge=0)
    # The same while the work is behind (a poll came back full, or a partition's due timers
    # did not fit its batch): each commit blocks the loop for broker round trips, and a
    # backlog's fires are already later than this, so fewer, larger transactions work it off
    # sooner. At 8,000 jobs/s the 80,000 commands of a burst came in faster that way.
    scheduler_backlog_commit_interval_ms: int = Field(default=100, ge=0)
    # Records consumed, and due timers handled per partition, in one loop iteration.
    scheduler_max_batch: int = 2000
    dispatch_batch_limit: int = 2000
    # A completed or cancelled job's record is kept this long, then deleted from the state.
    job_retention_ms: int = 24 * 3600 * 1000
    # Local state memory, per process (shared by every owned partition).
    rocksdb_block_cache_bytes: int = 64 * 1024 * 1024
    # Job records kept decoded in memory per owned partition: those with a run in flight and
    # those due to fire soonest (a one-off job is read back when it fires and when its verdict
    # comes; about 1.5 KiB each). See jobwheel.streams.state.cache.
    scheduler_record_cache: int = Field(default=4096, ge=0)
    # Keep a warm copy of every partition this process does not own (standby replicas), so a
    # failover replays only the changelog's tail; costs reading the other processes' changelog.
    scheduler_standby: bool = True
    # Fault injection for tests of a lagging scheduler: sleep this long in every iteration.
    scheduler_fault_delay_ms: int = 0
    # Runs of one job in flight at once; a fire past it is SKIPPED, a trigger or a replay
    # REJECTED (each saying why). Every run in flight is an entry of the job's record.
    scheduler_max_active_runs: int = Field(default=1000, ge=1)
    # The largest job record (key and value) the scheduler writes: keep it below the
    # producer's message.max.bytes (1,000,000 by default) and the changelog topic's
    # max.message.bytes. A change that would make a record larger is refused with an event.
    scheduler_max_record_bytes: int = Field(default=900_000, ge=4096)
    # A visibility deadline expires once the acks partition has been read past it; with
    # nothing left to read there (a silent worker side: no worker, or a run none can read),
    # it expires at most this long after its time anyway, so nothing waits for ever.
    scheduler_acks_silence_ms: int = Field(default=600_000, ge=0)
    # Fault injection for tests of an owner stalled inside a transaction: sleep this long
    # between adding the consumed offsets to a transaction and committing it.
    scheduler_fault_commit_delay_ms: int = 0

    # Queues (worker pools) jobs may name, comma-separated: each has its runs topic
    # (<prefix>.runs.<queue>; the default queue's is <prefix>.runs) and its workers' group
    # (<worker group>-<queue>; the default queue's is JOBWHEEL_WORKER_GROUP). `default` is
    # always declared. The scheduler rejects a job naming a queue not declared here.
    queues: str = DEFAULT_QUEUE

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
    # Each worker announces the tasks it serves on the workers topic this often (and at start
    # and exit); readers (submit's task check, GET /workers) take a worker whose last record is
    # older than 3 of its own intervals for gone (jobwheel.schemas.workers).
    worker_announce_interval_ms: int = Field(default=5_000, ge=100)
    # Fault injection for tests of a runs consumer that stops rejoining its group: once its
    # partitions are lost it leaves the group and does not join again by itself.
    worker_fault_stop_rejoining: bool = False

    # Status (consumers/status)
    clickhouse_url: str | None = None
    status_group: str = "jobwheel-status"
    status_ttl_days: int = 30
    clickhouse_database: str = "jobwheel"
    status_batch_size: int = 50_000
    status_batch_ms: int = 500
    # A busy sink inserts less often: a batch that holds status_busy_rows rows by the time it
    # is status_batch_ms old keeps growing until it is status_busy_batch_ms old (or full). An
    # embedded insert costs about 40 ms of CPU whatever its size, plus merging the parts it
    # makes (consumers/status/sink.py, BENCHMARKS.md "The status sink's inserts under load").
    status_busy_rows: int = Field(default=2_500, ge=1)
    status_busy_batch_ms: int = Field(default=2_000, ge=0)
    # The status service's memory budget (the sink process, or `jobwheel serve`): the embedded
    # engine's limit and caches, the consumer's fetch queue and the largest insert batch are
    # derived from it (consumers/status/memory.py; docs/operations.md, "Memory").
    status_memory_mib: int = Field(default=1024, ge=512)
    # The status sink's blocking Kafka calls (offset commit, close) still running this long are
    # hung: it logs it and exits with code 75 for its supervisor to restart it (see
    # jobwheel.watchdog; a commit normally returns within the request timeout, 60 s at most).
    status_call_deadline_ms: int = Field(default=120_000, gt=0)
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_url: str | None = None
    # Bearer tokens of the status API (every endpoint but /health needs one when either is set).
    # The token may write (POST /jobs, job control) and read; the read token only reads
    # (GET endpoints and POST /sql). Each can come from a file instead (secrets mounted as
    # files); the CLI sends the token, else the read token.
    api_token: SecretStr | None = None
    api_token_file: Path | None = None
    api_read_token: SecretStr | None = None
    api_read_token_file: Path | None = None
    # /sql on a ClickHouse server: a URL whose user is read-only (a readonly profile and SELECT
    # on the jobwheel database only, see deploy/compose/clickhouse/); unset: the store's URL.
    clickhouse_sql_url: str | None = None
    # /sql queries running at once (each has its own connection, so a slow one blocks no other
    # request); more are answered 429 at once.
    sql_concurrency: int = 4

    # Producer limits
    max_args_bytes: int = 64 * 1024

    # `jobwheel health` and the scheduler's readiness: a partition that has not committed for
    # this long while it has input to read or a timer overdue is reported stuck.
    health_stuck_after_ms: int = 30_000
    # A service's liveness (/health/live): its loop has turned within this long (a hung loop
    # is restarted by whoever watches the probe).
    health_live_after_ms: int = 120_000
    # Readiness endpoints `jobwheel health` asks besides those of a running `jobwheel up`:
    # "name=http://host:port,..." (or bare URLs), each serving /health/ready.
    health_urls: str = ""

    # Metrics and health over HTTP (/metrics, /health/live, /health/ready) of a long-running
    # process (scheduler, worker, serve, sink); unset: no server, nothing bound. `jobwheel up`
    # gives each of its services a port of its own.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    # Logging
    log_level: str = "INFO"
    # Unset: text when stderr is a terminal, JSON otherwise (jobwheel.logs.choose_format).
    log_format: Literal["json", "text"] | None = None

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"one of {', '.join(LOG_LEVELS)}")
        return level

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, value: str) -> str:
        from jobwheel.errors import ValidationError
        from jobwheel.schemas.validation import queue

        for name in (q.strip() for q in value.split(",")):
            if name:
                try:
                    queue(name)
                except ValidationError as exc:
                    raise ValueError(str(exc)) from exc
        return value

    @field_validator("broker_jvm_options")
    @classmethod
    def _jvm_options(cls, value: str) -> str:
        jvm_options(value)
        return value

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @model_validator(mode="after")
    def _default_bootstrap(self) -> Settings:
        if not self.bootstrap_servers:
            object.__setattr__(self, "bootstrap_servers", f"127.0.0.1:{self.broker_port}")
        return self

    @model_validator(mode="after")
    def _call_deadline_past_timeout(self) -> Settings:
        deadline_ms = self.scheduler_call_deadline_ms
        if deadline_ms and deadline_ms <= self.scheduler_call_timeout_s * 1000:
            raise ValueError(
                f"JOBWHEEL_SCHEDULER_CALL_DEADLINE_MS={deadline_ms} would end a scheduler whose "
                f"transactional call is still within its own timeout "
                f"({self.scheduler_call_timeout_s * 1000:.0f} ms, from "
                "JOBWHEEL_SCHEDULER_TRANSACTION_TIMEOUT_MS): set it above that, or 0 for the "
                "default"
            )
        return self

    @property
    def scheduler_call_timeout_s(self) -> float:
        """The timeout given to each blocking transactional call (send offsets, commit,
        abort): the transaction timeout, at least 5 s (a shorter one times out healthy commits
        under load and makes the engine resume them over and over)."""
        return max(5.0, self.scheduler_transaction_timeout_ms / 1000)

    @property
    def scheduler_call_deadline_s(self) -> float:
        """How long a transactional call may block before the scheduler exits (see
        ``scheduler_call_deadline_ms``)."""
        if self.scheduler_call_deadline_ms:
            return self.scheduler_call_deadline_ms / 1000
        return 3 * self.scheduler_call_timeout_s

    @property
    def scheduler_offsets_deadline_s(self) -> float:
        """How long ``send_offsets_to_transaction`` alone may block before the scheduler exits:
        ``scheduler_call_deadline_ms`` when set, else the call's own timeout and
        :data:`OFFSETS_DEADLINE_MARGIN_S`. Shorter than the other calls' deadline because it
        is never resumed: a timeout replaces the producer, so a call still blocked past its
        timeout is librdkafka's hang on a cached group coordinator whose broker went away
        (issue 5511), not a slow broker. It came in 2 of 7 of the cluster tests' kills of the
        scheduler group's coordinator (docs/operations.md), each costing the full deadline."""
        if self.scheduler_call_deadline_ms:
            return self.scheduler_call_deadline_ms / 1000
        return self.scheduler_call_timeout_s + OFFSETS_DEADLINE_MARGIN_S

    @property
    def scheduler_claim_stall_s(self) -> float:
        """How long a claim may fail to read the group's committed offsets or to rewind its
        input, with Kafka reachable, before every client is replaced: the restore stall, and
        never less than the longest wait a healthy claim can have there (behind a previous
        owner's open transaction until the broker aborts it: the transaction timeout, plus
        the broker's check for timed-out transactions, 10 s by default, and 5 s of margin)."""
        return max(
            self.scheduler_restore_stall_ms / 1000,
            self.scheduler_transaction_timeout_ms / 1000 + 15.0,
        )

    @property
    def broker_jvm_args(self) -> tuple[str, ...]:
        """``broker_jvm_options`` as the JVM's arguments."""
        return jvm_options(self.broker_jvm_options)

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix, self.partitions, self.replication_factor, self.queue_names)

    @property
    def queue_names(self) -> tuple[str, ...]:
        """The declared queues (``JOBWHEEL_QUEUES``), ``default`` first, each once."""
        names = [q.strip() for q in self.queues.split(",") if q.strip()]
        return tuple(dict.fromkeys((DEFAULT_QUEUE, *names)))

    def worker_group_for(self, queue: str) -> str:
        """The consumer group of ``queue``'s workers: ``JOBWHEEL_WORKER_GROUP`` for the
        default queue (a deployment from before queues keeps its group and its offsets),
        ``<JOBWHEEL_WORKER_GROUP>-<queue>`` for any other."""
        return self.worker_group if queue == DEFAULT_QUEUE else f"{self.worker_group}-{queue}"

    @property
    def clickhouse_dsn(self) -> str:
        """The ClickHouse URL; embedded chdb in the data dir unless a server URL is set."""
        if self.clickhouse_url:
            return self.clickhouse_url
        return f"chdb://{(self.data_dir / 'clickhouse').resolve()}"

    @property
    def status_api_url(self) -> str:
        return self.api_url or f"http://{self.api_host}:{self.api_port}"

    def api_tokens(self) -> ApiTokens:
        """The API's bearer tokens, read from their files when given as files."""
        return ApiTokens(
            _secret(self.api_token, self.api_token_file, "JOBWHEEL_API_TOKEN"),
            _secret(self.api_read_token, self.api_read_token_file, "JOBWHEEL_API_READ_TOKEN"),
        )

    def librdkafka(
        self,
        role: kafka_keys.Role | None = None,
        service: kafka_keys.Service | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A confluent-kafka config: bootstrap servers, the pass-through layers of ``role``
        (and ``service``), then ``overrides``. Without a role (a tool's ad-hoc client) the
        common config as it is."""
        if role is None:
            layers = {**kafka_keys.CLIENT_DEFAULTS, **self.kafka_config}
        else:
            layers = kafka_keys.layered(
                self.kafka_config,
                getattr(self, f"kafka_{role}_config"),
                getattr(self, f"{service}_kafka_{role}_config", {}) if service else {},
                role,
            )
        return {"bootstrap.servers": self.bootstrap_servers, **layers, **overrides}

    @model_validator(mode="after")
    def _kafka_configs_fit_their_role(self) -> Settings:
        """A key in a config of one kind of client that such a client does not understand
        (a consumer key in a producer config) is a mistake librdkafka would only warn about."""
        for role in kafka_keys.ROLES:
            places = [(f"JOBWHEEL_KAFKA_{role.upper()}_CONFIG", f"kafka_{role}_config")]
            places += [
                (f"JOBWHEEL_{s.upper()}_KAFKA_{role.upper()}_CONFIG", f"{s}_kafka_{role}_config")
                for s in kafka_keys.SERVICES
                if f"{s}_kafka_{role}_config" in type(self).model_fields
            ]
            for env, name in places:
                wrong = kafka_keys.misplaced(getattr(self, name), role)
                if wrong:
                    raise ValueError(
                        f"{env} has keys a {role} does not understand: {', '.join(wrong)}; "
                        "move them to the config of the kind of client they belong to "
                        "(or to JOBWHEEL_KAFKA_CONFIG, which each client takes what it "
                        "understands from)"
                    )
        return self


@dataclass(frozen=True, repr=False)
class ApiTokens:
    """``write`` may do everything, ``read`` only read; no token set means no authentication."""

    write: str | None
    read: str | None

    @property
    def enabled(self) -> bool:
        return self.write is not None or self.read is not None

    @property
    def client(self) -> str | None:
        """What a client (the CLI) sends: the write token if it has one, else the read token."""
        return self.write or self.read

    def __repr__(self) -> str:  # never print a secret
        write, read = ("set" if t else None for t in (self.write, self.read))
        return f"ApiTokens(write={write}, read={read})"


def _secret(value: SecretStr | None, path: Path | None, env: str) -> str | None:
    if value is not None and path is not None:
        raise ConfigError(f"set {env} or {env}_FILE, not both")
    if path is not None:
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{env}_FILE={path} cannot be read: {exc.strerror}") from exc
        if not text:
            raise ConfigError(f"{env}_FILE={path} is empty; put the token in it")
        return text
    if value is None:
        return None
    return value.get_secret_value().strip() or None


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/jobwheel``, else ``~/.local/share/jobwheel``; ``./.jobwheel`` (made
    absolute) only when there is no home directory to put it in."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "jobwheel"
    try:
        return Path.home() / ".local" / "share" / "jobwheel"
    except RuntimeError:
        return Path(".jobwheel").absolute()


@functools.cache
def get_settings() -> Settings:
    return Settings()
