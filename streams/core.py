"""What the rooms of the scheduler engine share: its state, made in one place.

:class:`~jobwheel.streams.engine.SchedulerEngine` is one object in four rooms, each a mixin on
:class:`EngineCore`: the loop (:mod:`jobwheel.streams.engine`), the partitions it holds and
their transitions (:mod:`jobwheel.streams.tasks`), the changelog reading of claims and standby
copies (:mod:`jobwheel.streams.restore`) and the transaction (:mod:`jobwheel.streams.commit`).
This module holds what they all read and write (the settings, the clients, the clock and the
codec, the held tasks, the open transaction's buffers, the counters) and the small helpers more
than one room uses. It does no work of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobwheel.clock import BrokerBoundClock, Clock, SystemClock
from jobwheel.errors import BrokerError
from jobwheel.kafka.queues import QueueDirectory
from jobwheel.logs import Sampled
from jobwheel.retry import Backoff
from jobwheel.schemas.codec import Codec
from jobwheel.settings import Settings
from jobwheel.streams.kafka import (
    NO_OFFSET,
    AcksConsumer,
    ChangelogReader,
    InputConsumer,
    TransactionalProducer,
    scheduler_watchdog,
)
from jobwheel.streams.metrics import EngineMeters
from jobwheel.streams.state.directory import StateDirectory
from jobwheel.streams.state.rocksdb import RocksDBLimits
from jobwheel.watchdog import kafka_reachable

if TYPE_CHECKING:
    from jobwheel.streams.commit import _Out
    from jobwheel.streams.tasks import Task

#: Every room of the engine logs under the engine's name (operators filter on it).
log = logging.getLogger("jobwheel.streams.engine")


@dataclass
class EngineStats:
    """Counters since start (read by the status log line and, later, metrics)."""

    commands: int = 0
    acks: int = 0
    fired: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    transactions: int = 0
    aborts: int = 0
    resets: int = 0
    changelog_rebuilds: int = 0
    stuck_claims: int = 0  # claims given up on with every client replaced (Restorer)
    last_commit_ms: int = 0


class EngineCore:
    """The state of :class:`~jobwheel.streams.engine.SchedulerEngine` that its rooms share (see
    the module doc): mixed in with :class:`~jobwheel.streams.tasks.TaskManager`,
    :class:`~jobwheel.streams.restore.Restorer` and :class:`~jobwheel.streams.commit.Committer`."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        codec: Codec | None = None,
        directory: StateDirectory | None = None,
    ) -> None:
        self.settings = settings
        self.topics = settings.topics
        # JOBWHEEL_QUEUES and the queues added at run time (their runs topics, read through
        # the input consumer when a record names a queue not known yet).
        self.queues = QueueDirectory(settings, self._topic_names)
        # "Now" is the wall clock held within the tolerance of the broker's time as read
        # (see BrokerBoundClock): a step of this host's clock moves it that much at most.
        self.clock = BrokerBoundClock(
            clock or SystemClock(),
            ahead_ms=settings.scheduler_clock_step_tolerance_ms,
            behind_ms=settings.scheduler_clock_tolerance_ms,
        )
        self.codec = codec or Codec(settings.schema_registry_url)
        self.directory = directory or StateDirectory(
            settings.data_dir / "scheduler" / settings.scheduler_app_id
        )
        self.resources = RocksDBLimits(
            block_cache_bytes=settings.rocksdb_block_cache_bytes
        ).resources()
        self.changelog_topic = self.topics.changelog(settings.scheduler_app_id)
        self.stats = EngineStats()
        self.meters = EngineMeters()
        # Per partition held: its ownership (an active task) or a warm copy (a standby task).
        self.tasks: dict[int, Task] = {}
        # For the metrics server's thread, which reads these and never calls a client: the
        # loop's last turn, whether the group has assigned anything yet, and the end offsets
        # (requests, acks) of the held partitions as of the last fetch, sampled by the loop.
        self.turned_at = time.monotonic()
        self.joined = False
        self.input_ends: dict[int, tuple[int | None, int | None]] = {}
        self._ends_at = 0.0
        self._stop = threading.Event()
        self._instance = ""
        # Redoing an aborted transaction: 0.1 s, doubling up to 5 s, until one commits.
        self._backoff = Backoff(start_s=0.1, max_s=5.0)
        self._turn = 0
        # The transaction being built: its outputs and the partitions it changed.
        self._out: list[_Out] = []
        self._touched: set[int] = set()
        self._txn_since: float | None = None
        self._commit_interval_s = settings.scheduler_commit_interval_ms / 1000
        self._backlog_interval_s = max(
            self._commit_interval_s, settings.scheduler_backlog_commit_interval_ms / 1000
        )
        self._txn_backlog = False  # the open transaction began or grew behind its input
        self._last_status_log = 0.0
        self._clamp_lines = Sampled()
        # A claim's failed asks of the group consumer: a broker answering NOT_COORDINATOR at
        # once was asked dozens of times a second, each a warning line (see _claim_failed).
        self._claim_lines = Sampled(5.0)
        #: An ask for a claim's committed offsets came back unanswered in this iteration while
        #: other partitions process: the other claims ask in the next (Restorer._restore).
        self._offsets_ask_spent = False
        self._logged_counters: tuple[int, ...] = ()
        self._closing = False
        # The largest job record the processors write; lowered when the producer refuses a
        # smaller changelog record (see _produce).
        self._record_limit = settings.scheduler_max_record_bytes
        # Does a bootstrap server accept connections: one probe for the call watchdog and the
        # stuck-claim bound (only such time counts for either).
        self._kafka_reachable = kafka_reachable(settings)
        # Every blocking transactional call runs under this deadline (streams/kafka.py).
        self.watchdog = scheduler_watchdog(settings, self._kafka_reachable)
        self.producer: TransactionalProducer | None = None
        self.input: InputConsumer | None = None
        self.acks: AcksConsumer | None = None
        self.changelog: ChangelogReader | None = None
        # Restoring partition -> (changelog position, or None: not measured; since when it
        # has not moved): see _restore_stalled.
        self._stalled_since: dict[int, tuple[int | None, float]] = {}

    def _topic_names(self, timeout_s: float) -> list[str]:
        """The broker's topics, for :attr:`queues` (asked on the loop's thread, which alone
        uses the input consumer)."""
        if self.input is None:
            raise BrokerError("the scheduler's consumer is not running")
        return self.input.topic_names(timeout_s)


def _start(offset: int | None) -> int:
    return offset if offset is not None else NO_OFFSET


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
