"""The scheduler engine: an exactly-once stream processor on Kafka transactions.

Kafka Streams' model (EOS v2, KIP-447), in one thread per process:

1. **Poll** a batch from the requests topic (the group decides which partitions this process
   owns) and from the acks partitions of the owned partitions.
2. **Process** each record with the partition's pure :class:`SchedulerProcessor`; its state
   changes stay in the partition's write buffer.
3. **Punctuate** every ready partition with the wall clock: due fires, retries and expiries,
   and visibility deadlines up to the acks watermark (see below).
4. **Commit** everything the iteration caused in ONE transaction: runs, status events, dead
   letters, one changelog record per changed job, and the consumed offsets of every owned
   partition (``send_offsets_to_transaction``, with the group's metadata and a progress note
   for ``jobwheel health``). Then write the buffered changes to the local RocksDB with the new
   changelog checkpoint. Nothing waits in memory across transactions. Under load, consecutive
   iterations share one transaction for up to ``JOBWHEEL_SCHEDULER_COMMIT_INTERVAL_MS`` (fewer,
   larger transactions); an iteration that finds nothing more to do commits at once. A
   partition that leaves before its work committed forgets that work: its next owner reads the
   same input from the committed offsets and decides the same things again.

If the transaction aborts, the buffers are discarded and the inputs are rewound to the last
commit, so the batch is processed again from committed state (run ids and event ids are
deterministic, and the aborted outputs are never visible to ``read_committed`` readers). If the
producer is fenced or hits a fatal error, every partition is dropped and the group rejoined.
A process that was fenced out of the group (a SIGSTOPped owner that wakes up) cannot commit:
the transaction's offset commit carries its stale group generation and the broker refuses it.

**The acks watermark.** A visibility deadline expires only once the acks partition has been
read past it: the watermark is the broker append time of the latest ack read from the partition.
So a scheduler that lags never re-dispatches a run whose SUCCEEDED or HEARTBEAT is already on
the topic. And since acks partition ``p`` is written by the worker that owns runs partition
``p``, the watermark is also that worker's sign of life: while the partition's worker side is
stalled (its worker killed and the group rebalancing, or no worker at all), no deadline expires
and nothing is re-dispatched into a queue that nobody reads; Kafka itself redelivers the
unfinished runs to the partition's next worker (workers commit only finished runs).

**Partitions** arrive paused; their state is restored from the changelog (from the local
checkpoint, so a restart on the same disk replays only the tail) in slices between iterations,
then their inputs resume and they are *ready*. The ownership epoch (fencing token on runs) is
bumped and changelogged on every claim.

**Standby replicas** (``JOBWHEEL_SCHEDULER_STANDBY``, on by default; Kafka Streams'
``num.standby.replicas``): every partition this process does not own is kept as a warm copy,
read from the changelog between iterations. When such a partition is assigned here (its owner
died, or a rebalance moved it) only the changelog's tail is left to read: a failover costs the
session timeout, not a restore of the whole partition. The price is reading every other
process's changelog too.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from jobwheel.clock import BrokerBoundClock, Clock, SystemClock, clamp_ms
from jobwheel.errors import (
    BrokerError,
    DeliveryError,
    FencedError,
    JobwheelError,
    SchemaDecodeError,
    ValidationError,
)
from jobwheel.kafka.queues import QueueDirectory
from jobwheel.retry import Backoff
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.deadletter import REPLAYED_FROM_HEADER, note_replay
from jobwheel.schemas.models import JobCommand, StatusEvent
from jobwheel.schemas.partitioning import partition_for
from jobwheel.schemas.progress import Progress
from jobwheel.schemas.topics import (
    DEAD_RUN_KIND,
    DEFAULT_QUEUE,
    DISPATCHED_HEADER,
    ERROR_HEADER,
    KIND_HEADER,
    QUEUE_HEADER,
    RUN_HEADER,
    SIZE_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
    STATE_HEADER,
    run_header,
)
from jobwheel.schemas.validation import check_key
from jobwheel.settings import Settings
from jobwheel.streams.kafka import (
    NO_OFFSET,
    AcksConsumer,
    ChangelogReader,
    InputConsumer,
    Record,
    TransactionalProducer,
    scheduler_watchdog,
)
from jobwheel.streams.metrics import EngineMeters
from jobwheel.streams.processor import Output, SchedulerProcessor
from jobwheel.streams.state.directory import StateDirectory
from jobwheel.streams.state.partition import EPOCH_KEY, PartitionState, RocksDBBackend
from jobwheel.streams.state.recovery import apply_batch, plan_restore, rebuild_index
from jobwheel.streams.state.rocksdb import RocksDBLimits

log = logging.getLogger(__name__)

#: Longest poll when nothing is due: acks are read at least this often.
IDLE_WAIT_S = 0.1
#: Time given to restoring per iteration while other partitions are ready.
RESTORE_SLICE_S = 0.2
#: Time given to keeping standby copies up to date per iteration.
STANDBY_SLICE_S = 0.05
#: Acks whose state changes nothing the scheduler decides on; skipped by header, not decoded.
SKIPPED_ACKS = {b"STALE"}
#: Records one transaction may carry from punctuation: a partition far behind (a day of
#: downtime, a burst of due jobs) is worked off over several transactions, and the consumer is
#: polled between them.
MAX_TRANSACTION_RECORDS = 20_000
#: A dead-letter copy of a record larger than this carries a reference instead of the bytes.
MAX_DEAD_LETTER_VALUE = 512 * 1024
STATUS_LOG_INTERVAL_S = 60.0
#: How often the loop samples its inputs' end offsets for the metrics (lag, stuck partitions).
ENDS_SAMPLE_S = 0.5
_EPOCH = struct.Struct(">q")


class Phase(enum.StrEnum):
    STANDBY = "standby"  # not ours: a warm copy, kept up to date from the changelog
    RESTORING = "restoring"  # ours: catching up with the changelog, inputs paused
    READY = "ready"  # ours: processing


@dataclass
class RestoreProgress:
    """How far a partition's local state has read its changelog. It belongs to the local
    state, not to an ownership: it passes from a standby task to the active task of a claim
    and back, as the state does."""

    end: int = -1  # the changelog end to reach (-1: not measured yet)
    reading: bool = False
    fresh: bool = False  # first pass from scratch: records first, the index at the end
    applied: int = 0
    next: int = 0  # next changelog offset to restore (progress, for metrics)


@dataclass
class StandbyTask:
    """A warm copy of a partition this process does not own: its local state and how far it
    has read the changelog, nothing else. A claim hands both to a new :class:`PartitionTask`;
    a revoke hands them back to a new standby task."""

    partition: int
    backend: RocksDBBackend
    state: PartitionState
    restore: RestoreProgress = field(default_factory=RestoreProgress)

    @property
    def phase(self) -> Phase:
        return Phase.STANDBY


@dataclass
class PartitionTask:
    """This process's ownership of one partition (Kafka Streams' active task): made anew on
    every claim, dropped on revoke. Only the local state and its restore progress outlive it;
    every field that describes an ownership (epoch, input positions, the acks watermark, what
    the worker reached, health notes) is born with the claim, so nothing of a previous
    ownership of the same partition by this process can leak into the next one."""

    partition: int
    backend: RocksDBBackend
    state: PartitionState
    phase: Phase = Phase.RESTORING
    restore: RestoreProgress = field(default_factory=RestoreProgress)
    processor: SchedulerProcessor | None = None
    restore_started: float = field(default_factory=time.monotonic)
    # Input positions: next offset to read, as processed (uncommitted) and as committed.
    requests_next: int | None = None
    acks_next: int | None = None
    requests_committed: int | None = None
    acks_committed: int | None = None
    acks_seen_ms: int = 0
    acks_seen_committed_ms: int = 0
    # The latest dispatch time of a run the partition's worker reported on (acks header).
    reached_ms: int | None = None
    reached_committed_ms: int | None = None
    # The same two facts per queue (acks header jobwheel.queue; none: the default queue):
    # each pool's acks count for its own runs only (see _queue_watermark).
    queue_seen: dict[str, int] = field(default_factory=dict)
    queue_seen_committed: dict[str, int] = field(default_factory=dict)
    queue_reached: dict[str, int] = field(default_factory=dict)
    queue_reached_committed: dict[str, int] = field(default_factory=dict)
    behind: bool = False  # punctuation left due timers for the next iteration
    epoch: int = 0
    epoch_committed: bool = False
    # The group's committed offsets were read for this claim (before the changelog's end is
    # measured: see SchedulerEngine._start_restore).
    offsets_read: bool = False
    # Health: the progress note of the open transaction, and of the last commit (or, before
    # the first, of the moment the partition became ready).
    pending_note: Progress | None = None
    committed_note: Progress | None = None

    @classmethod
    def claim(cls, standby: StandbyTask) -> PartitionTask:
        """The active task of a new claim, on the local state a standby task kept warm; the
        changelog's tail is measured again (the copy only has to catch up with it)."""
        standby.restore.reading = False
        return cls(standby.partition, standby.backend, standby.state, restore=standby.restore)

    def standby(self) -> StandbyTask:
        """What is left of this task once the partition is given up: its local state (with
        nothing uncommitted: the caller discarded that) and its restore progress."""
        self.restore.reading = False
        return StandbyTask(self.partition, self.backend, self.state, self.restore)


#: What the engine holds of a partition: its ownership, or a warm copy of its state.
Task = PartitionTask | StandbyTask


class _Out(NamedTuple):
    """One record of the transaction being built (a tuple: several per job)."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


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
    last_commit_ms: int = 0


class SchedulerEngine:
    """One scheduler process's consume-process-produce loop (see the module doc)."""

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
        self._last_status_log = 0.0
        self._logged_counters: tuple[int, ...] = ()
        self._closing = False
        # The largest job record the processors write; lowered when the producer refuses a
        # smaller changelog record (see _produce).
        self._record_limit = settings.scheduler_max_record_bytes
        # Every blocking transactional call runs under this deadline (streams/kafka.py).
        self.watchdog = scheduler_watchdog(settings)
        self.producer: TransactionalProducer | None = None
        self.input: InputConsumer | None = None
        self.acks: AcksConsumer | None = None
        self.changelog: ChangelogReader | None = None
        # Restoring partition -> (changelog position, or None: not measured; since when it
        # has not moved): see _restore_stalled.
        self._stalled_since: dict[int, tuple[int | None, float]] = {}

    # --- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the current iteration (committed), leave the group and return from run()."""
        self._stop.set()

    def run(self, on_iteration: Callable[[], None] | None = None) -> None:
        self.directory.lock()
        try:
            self._instance = self.directory.instance_id()
            self._connect()
            log.info(
                "scheduler started",
                extra={
                    "instance": self._instance,
                    "group": self.settings.scheduler_app_id,
                    "protocol": self.settings.scheduler_group_protocol,
                    "static_member": self.input is not None and self.input.static,
                    "state_dir": str(self.directory.root),
                },
            )
            while not self._stop.is_set():
                self.step()
                if on_iteration is not None:
                    on_iteration()
            if self.producer is not None:
                self._commit_pending()
        finally:
            self._disconnect()
            self.watchdog.close()
            self.directory.unlock()
            log.info("scheduler stopped", extra={"instance": self._instance})

    def _connect(self) -> None:
        client = f"{self.settings.scheduler_app_id}-{self._instance}"
        self.joined = False
        self.producer = TransactionalProducer(self.settings, client, self.watchdog)
        # Asked again of the same producer for a bounded time only: a client that timed out
        # for that long may hold a coordinator it will not look up again (init_transactions
        # was seen timing out for over a minute after the broker was back); a new one asks.
        fresh_after_s = self.settings.scheduler_init_fresh_after_ms / 1000
        since = time.monotonic()
        while True:
            self.turned_at = time.monotonic()
            try:
                self.producer.init(give_up_s=fresh_after_s)
                break
            except BrokerError as exc:
                failing_s = time.monotonic() - since
                replace = failing_s >= fresh_after_s
                log.error(
                    "cannot register the transactional producer; retrying",
                    extra={
                        "error": str(exc),
                        "failing_s": round(failing_s, 1),
                        "new_producer": replace,
                        "setting": "JOBWHEEL_SCHEDULER_INIT_FRESH_AFTER_MS",
                    },
                )
                if replace:
                    self.producer.close()
                    self.producer = TransactionalProducer(self.settings, client, self.watchdog)
                    since = time.monotonic()
                if self._stop.wait(2.0):
                    return
        self.input = InputConsumer(self.settings, client, self.watchdog)
        self.acks = AcksConsumer(self.settings, client + "-acks")
        self.changelog = ChangelogReader(self.settings, client + "-restore")
        self.input.subscribe(self._on_assign, self._on_revoke, self._on_lost)

    def _disconnect(self) -> None:
        self._closing = True  # what the revoke callback gives up is closed, not kept as standby
        try:
            if self.input is not None:
                self.input.close()  # runs the revoke callback
            self._close_tasks(list(self.tasks), "stopped")
        finally:
            self._closing = False
        for client in (self.acks, self.changelog, self.producer):
            if client is not None:
                client.close()
        self.input = self.acks = self.changelog = self.producer = None
        self.input_ends = {}

    def _reset(self, reason: str) -> None:
        """Fatal producer error or fenced: drop every partition's uncommitted state, replace
        the clients and rejoin the group (partitions come back through a restore from the
        local checkpoint)."""
        self.stats.resets += 1
        log.error("dropping all partitions and rejoining the group", extra={"reason": reason})
        self._out, self._touched, self._txn_since = [], set(), None
        self.meters.discard()
        for task in list(self.tasks.values()):
            task.state.discard()
        self._disconnect()
        if not self._stop.is_set():
            self._connect()

    # --- rebalance callbacks (run inside the input consumer's poll) -------------------------

    def _on_assign(self, partitions: list[int]) -> None:
        self.joined = True
        if not partitions:
            return
        warm = []
        for p in partitions:
            task = self.tasks.get(p)
            if task is None:
                task = self._open_standby(p)
            elif isinstance(task, PartitionTask):
                continue  # already ours
            else:
                warm.append(p)
            self.tasks[p] = PartitionTask.claim(task)  # a new ownership: every field fresh
        log.info(
            "partitions assigned; restoring",
            extra={"partitions": sorted(partitions), "from_standby": warm},
        )

    def _open_standby(self, partition: int) -> StandbyTask:
        """Open a partition's local state, not owned (yet)."""
        backend = RocksDBBackend(self.directory.partition(partition), self.resources)
        state = PartitionState(backend, self.settings.scheduler_record_cache)
        return StandbyTask(partition, backend, state)

    def _standby_all(self) -> None:
        """Keep a warm copy of every partition not owned here (see the module doc)."""
        if not self.settings.scheduler_standby:
            return
        for p in range(self.settings.partitions):
            if p not in self.tasks:
                self.tasks[p] = self._open_standby(p)

    def _on_revoke(self, partitions: list[int]) -> None:
        self._drop_pending(partitions)
        self._close_tasks(partitions, "revoked")

    def _on_lost(self, partitions: list[int]) -> None:
        self._drop_pending(partitions)
        self._close_tasks(partitions, "lost")

    def _close_tasks(self, partitions: list[int], why: str) -> None:
        """Give partitions up; one log line for the lot (one per rebalance, not per partition)."""
        owned = []
        for p in sorted(partitions):
            task = self.tasks.get(p)
            if task is not None and self._close_task(task):
                owned.append(p)
        if owned:
            level = logging.WARNING if why == "lost" else logging.INFO
            log.log(level, f"partition {why}", extra={"partitions": owned})

    def _close_task(self, task: Task) -> bool:
        """Give a partition up, with whatever it had not committed (see :meth:`_drop_pending`):
        keep it as a standby copy, or close it. True when it was owned (not a standby copy)."""
        if self.acks is not None:
            self.acks.unassign(task.partition)
        if self.changelog is not None:
            self.changelog.unassign(task.partition)
        task.state.discard()
        was_owned = isinstance(task, PartitionTask)
        if self.settings.scheduler_standby and not self._closing and not self._stop.is_set():
            if isinstance(task, PartitionTask):  # the ownership ends; its local state stays
                self.tasks[task.partition] = task.standby()
        else:
            self.tasks.pop(task.partition, None)
            task.backend.close()
        return was_owned

    # --- the loop ---------------------------------------------------------------------------

    def step(self) -> None:
        """One iteration: poll, process, punctuate, commit (see the module doc)."""
        assert self.input is not None and self.acks is not None
        self.turned_at = time.monotonic()
        try:
            requests = self.input.poll(self.settings.scheduler_max_batch, self._wait_s())
            acks = self.acks.poll(self.settings.scheduler_max_batch, 0)
        except FencedError as exc:
            self._reset(str(exc))
            return
        except BrokerError as exc:
            log.error("polling failed", extra={"error": str(exc)})
            self._stop.wait(1.0)
            return
        polled_at = time.monotonic()
        if self.settings.scheduler_fault_delay_ms:
            time.sleep(self.settings.scheduler_fault_delay_ms / 1000)
        self._restore(
            RESTORE_SLICE_S if any(t.phase is Phase.READY for t in self.tasks.values()) else 1.0
        )
        self._standby_all()
        self._observe_broker_time(requests, acks)
        now = self.clock.now_ms()
        out, touched = self._out, self._touched
        for record in requests:
            self._on_request(record, now, out, touched)
        for record in acks:
            self._on_ack(record, now, out, touched)
        # Start at another partition each time, so one partition's backlog cannot starve the
        # others of the transaction's record budget.
        ready = [t for t in self.tasks.values() if t.phase is Phase.READY]
        self._turn += 1
        handled = 0
        for i in range(len(ready)):
            handled += self._punctuate(ready[(self._turn + i) % len(ready)], now, out, touched)
        if touched or out:
            if self._txn_since is None:
                self._txn_since = polled_at  # the transaction's work began with this poll
            # Under load, iterations share a transaction for up to the commit interval: fewer,
            # larger transactions. When an iteration found nothing more to do, commit at once.
            idle = not (requests or acks or handled)
            if (
                idle
                or len(out) >= MAX_TRANSACTION_RECORDS
                or time.monotonic() - self._txn_since >= self._commit_interval_s
                or self._stop.is_set()
            ):
                self._commit_pending()
        else:
            self._backoff.reset()
        self._sample_ends()
        self._maybe_log_status()

    def _observe_broker_time(self, requests: list[Record], acks: list[Record]) -> None:
        """Tell the clock the broker's time: the append time of each partition's last record
        read, when that is the end of the partition (a backlog's records are old news)."""
        assert self.input is not None and self.acks is not None
        for consumer, batch in ((self.input, requests), (self.acks, acks)):
            last: dict[int, Record] = {}
            for record in batch:
                if record.broker_time:
                    last[record.partition] = record
            for p, record in last.items():
                end = consumer.cached_end(p)
                if end is not None and record.offset + 1 >= end:
                    self.clock.observe(record.timestamp_ms)

    def _commit_pending(self) -> None:
        out, touched = self._out, self._touched
        self._out, self._touched, self._txn_since = [], set(), None
        if out or touched:
            self._commit(out, touched)

    def _drop_pending(self, partitions: list[int]) -> None:
        """Partitions leave before the transaction carrying their work committed: forget that
        work (their new owner reads the same input again from the committed offsets)."""
        gone = set(partitions)
        if gone & self._touched:
            self._out = [r for r in self._out if r.partition not in gone]
            self._touched -= gone
            self.meters.discard(gone)

    def _wait_s(self) -> float:
        """How long the next poll may block: not at all while there is work to do, else until
        the next timer (or the open transaction's commit), at most :data:`IDLE_WAIT_S`."""
        if self._backoff.delay_s:
            return self._backoff.delay_s
        ready = [t for t in self.tasks.values() if t.phase is Phase.READY]
        if any(t.phase is Phase.RESTORING for t in self.tasks.values()) or any(
            t.behind for t in ready
        ):
            return 0.0
        now = self.clock.now_ms()
        wait = IDLE_WAIT_S
        if self._txn_since is not None:
            wait = max(0.0, self._commit_interval_s - (time.monotonic() - self._txn_since))
        for task in ready:
            assert task.processor is not None
            due = task.processor.next_due_ms(self._acks_watermark(task))
            if due is not None:
                wait = min(wait, max(0.0, (due - now) / 1000))
        return wait

    # --- input ------------------------------------------------------------------------------

    def _ready(self, record: Record) -> PartitionTask | None:
        task = self.tasks.get(record.partition)
        return task if task is not None and task.phase is Phase.READY else None

    def _on_request(self, record: Record, now: int, out: list[_Out], touched: set[int]) -> None:
        task = self._ready(record)
        if task is None:
            return
        task.requests_next = record.offset + 1
        touched.add(task.partition)
        processor = task.processor
        assert processor is not None
        key = record.key
        job_id = (key or b"").decode("utf-8", "replace")
        try:
            try:
                cmd = self.codec.decode(record.value or b"")
            except SchemaDecodeError as exc:
                self._reject(task, record, f"undecodable record: {exc}", job_id, now, out)
                return
            if not isinstance(cmd, JobCommand):
                reason = f"a {type(cmd).__name__} is not a JobCommand"
                self._reject(task, record, reason, job_id, now, out)
                return
            try:
                check_key(key, cmd)
            except ValidationError as exc:
                self._reject(task, record, f"invalid command: {exc}", cmd.job_id, now, out)
                return
            expected = partition_for(cmd.job_id, self.settings.partitions)
            if expected != task.partition:
                reason = (
                    f"job {_cut(cmd.job_id)!r} belongs to partition {expected}, not "
                    f"{task.partition}: use the murmur2 partitioner on the raw UTF-8 job id"
                )
                self._reject(task, record, reason, cmd.job_id, now, out)
                return
            self.stats.commands += 1
            origin = _header(record, REPLAYED_FROM_HEADER)
            if record.broker_time and origin is None:  # a replay keeps its original issue time
                cmd = self._held_to_broker_time(cmd, record)
            result = processor.on_command(cmd, now)
            if origin is not None:  # `jobwheel dlq replay`: its answer says so
                result.status = note_replay(result.status, cmd.command_id, origin)
                self.meters.replays += 1
            self._emit(task, result, out)
            if result.rejected is not None:
                self._dead_letter(task, record, result.rejected, out)
        except JobwheelError as exc:
            self._reject(task, record, f"scheduler error: {exc}", job_id, now, out)
        except Exception as exc:  # a bug must not stop the partition: dead-letter the record
            log.exception(
                "command failed; dead-lettered",
                extra={"partition": record.partition, "offset": record.offset},
            )
            self._reject(task, record, f"scheduler error: {exc!r}", job_id, now, out)

    def _held_to_broker_time(self, cmd: JobCommand, record: Record) -> JobCommand:
        """The command with its issue time within the tolerance of its record's broker time:
        a client clock far ahead would delay a ``--now`` or ``--after`` job by its error, one
        far behind would place it in the past."""
        tolerance = self.settings.scheduler_clock_tolerance_ms
        issued = clamp_ms(cmd.issued_at_ms, record.timestamp_ms, tolerance)
        if issued == cmd.issued_at_ms:
            return cmd
        self.meters.issue_times_clamped += 1
        log.warning(
            "command issue time clamped to the broker's time",
            extra={
                "partition": record.partition,
                "offset": record.offset,
                "job_id": _cut(cmd.job_id),
                "issued_at_ms": cmd.issued_at_ms,
                "broker_ms": record.timestamp_ms,
                "skew_ms": cmd.issued_at_ms - record.timestamp_ms,
            },
        )
        return dataclasses.replace(cmd, issued_at_ms=issued)

    def _on_ack(self, record: Record, now: int, out: list[_Out], touched: set[int]) -> None:
        task = self._ready(record)
        if task is None:
            return
        task.acks_next = record.offset + 1
        task.acks_seen_ms = max(task.acks_seen_ms, record.timestamp_ms)
        touched.add(task.partition)
        try:
            self._apply_ack(task, record, now, out)
        except Exception as exc:  # a bug must not stop the partition: dead-letter the record
            log.exception(
                "ack failed; dead-lettered",
                extra={"partition": record.partition, "offset": record.offset},
            )
            self._dead_letter(task, record, f"scheduler error: {exc!r}", out)

    def _apply_ack(self, task: PartitionTask, record: Record, now: int, out: list[_Out]) -> None:
        """One ack, whatever its bytes: anything on the acks topic is input (a broken or
        hostile producer can write there), so a header the workers never write is ignored
        with a log line, and a record that is no ack is dead-lettered."""
        skip = False
        queue = DEFAULT_QUEUE
        reached: int | None = None
        for name, value in record.headers or ():
            if name == STATE_HEADER and value in SKIPPED_ACKS:
                skip = True
            elif name == QUEUE_HEADER and value:
                queue = value.decode("ascii", "replace")
            elif name == DISPATCHED_HEADER:
                reached = _dispatched_ms(value)
                if reached is None:
                    log.warning(
                        "ack header ignored: not a dispatch time in ms",
                        extra={
                            "partition": record.partition,
                            "offset": record.offset,
                            "header": name,
                            "value": None if value is None else _cut(repr(value)),
                        },
                    )
                elif task.reached_ms is None or reached > task.reached_ms:
                    task.reached_ms = reached
        # Per queue: one pool's acks say nothing about how far another pool has got. A queue
        # this scheduler does not know (a hostile header) is no queue of its runs.
        if queue not in self.queues:
            queue = DEFAULT_QUEUE
        seen = task.queue_seen.get(queue)
        if seen is None or record.timestamp_ms > seen:
            task.queue_seen[queue] = record.timestamp_ms
        if reached is not None:
            before = task.queue_reached.get(queue)
            if before is None or reached > before:
                task.queue_reached[queue] = reached
        if skip:
            return
        processor = task.processor
        assert processor is not None
        try:
            ev = self.codec.decode(record.value or b"")
            if not isinstance(ev, StatusEvent):
                raise SchemaDecodeError(f"a {type(ev).__name__} is not a StatusEvent")
        except SchemaDecodeError as exc:
            self.stats.rejected += 1
            log.warning(
                "undecodable ack dead-lettered",
                extra={"partition": record.partition, "offset": record.offset, "error": str(exc)},
            )
            self._dead_letter(task, record, f"undecodable ack: {exc}", out)
            return
        self.stats.acks += 1
        result = processor.on_ack(ev, now, record.timestamp_ms)
        self._emit(task, result, out)
        if result.rejected is not None:
            self.stats.rejected += 1
            log.warning(
                "invalid ack dead-lettered",
                extra={
                    "partition": record.partition,
                    "offset": record.offset,
                    "reason": _cut(result.rejected),
                },
            )
            self._dead_letter(task, record, f"invalid ack: {result.rejected}", out)

    @staticmethod
    def _acks_watermark(task: PartitionTask) -> int:
        """How far (broker time) this partition's acks have been read (see the module doc)."""
        return task.acks_seen_ms

    def _punctuate(self, task: PartitionTask, now: int, out: list[_Out], touched: set[int]) -> int:
        """Handle the partition's due timers; returns how many."""
        assert task.processor is not None
        budget = MAX_TRANSACTION_RECORDS - len(out)
        if budget <= 0:
            task.behind = True  # its turn comes in the next transaction
            return 0
        limit = self.settings.dispatch_batch_limit
        watermark = self._deadline_watermark(task, now)
        # Each timer's output is encoded as it is made: one the codec refuses is that
        # timer's failure (the processor undoes its change and gives the job its verdict),
        # not the process's.
        result, handled = task.processor.punctuate(
            now,
            limit,
            watermark,
            budget,
            reached_ms=task.reached_ms,
            emit=lambda part: self._emit(task, part, out),
            queue_watermark=lambda queue: self._queue_watermark(task, now, queue),
            reached_by_queue=task.queue_reached,
            queue_acked=task.queue_seen,
        )
        task.behind = handled >= limit or result.size >= budget
        if handled or task.state.dirty:
            touched.add(task.partition)
            self.stats.fired += len(result.runs)
        return handled

    def _deadline_watermark(self, task: PartitionTask, now: int) -> int:
        """Up to where visibility deadlines may expire: the acks watermark, and, while
        nothing is left unread on the partition's acks (its worker side is silent, not
        merely ahead of this reader), at least ``JOBWHEEL_SCHEDULER_ACKS_SILENCE_MS`` before
        now: a partition no worker answers on (none running, a run none can read) cannot
        hold a deadline, and its job, for ever."""
        return self._silence_bound(task, now, self._acks_watermark(task))

    def _topic_names(self, timeout_s: float) -> list[str]:
        """The broker's topics, for :attr:`queues` (asked on the loop's thread, which alone
        uses the input consumer)."""
        if self.input is None:
            raise BrokerError("the scheduler's consumer is not running")
        return self.input.topic_names(timeout_s)

    def _queue_watermark(self, task: PartitionTask, now: int, queue: str) -> int:
        """:meth:`_deadline_watermark` of one queue's runs: the acks its own workers wrote.
        All pools report on the one acks topic, so the partition's watermark moves with any
        pool's acks; a queue with no worker (or a stalled one) must not have its deadlines
        expired by another pool's acks and copies of its runs piled into its backlog. The
        silence ceiling is the partition's: with the acks read to the end, a deadline of any
        queue expires at most ``JOBWHEEL_SCHEDULER_ACKS_SILENCE_MS`` after its time."""
        return self._silence_bound(task, now, task.queue_seen.get(queue, 0))

    def _silence_bound(self, task: PartitionTask, now: int, seen: int) -> int:
        """``seen`` (an acks watermark), or the silence ceiling when it is behind that and the
        partition's acks are read to the end."""
        ceiling = now - self.settings.scheduler_acks_silence_ms
        if seen >= ceiling or self.acks is None:
            return seen
        # Silent means read to the end: the reader's own position (past transaction markers)
        # once it has fetched, else where this ownership has read or committed to. Unknown is
        # not silent: right after a claim nothing is read yet and the end not fetched, and the
        # tail a revoke dropped may hold the very verdicts the deadlines wait for.
        end = self.acks.cached_end(task.partition)
        position = self.acks.position(task.partition)
        if position is None:
            position = task.acks_next if task.acks_next is not None else task.acks_committed
        if end == 0:
            return ceiling  # nothing was ever acknowledged on the partition
        if end is None or position is None or position < end:
            return seen  # acks may be waiting to be read: their verdicts come first
        return ceiling

    # --- output -----------------------------------------------------------------------------

    def _emit(self, task: PartitionTask, result: Output, out: list[_Out]) -> None:
        """Encode ``result`` into the transaction: all of it, or (a record the codec
        refuses) nothing, and the error raised to the caller."""
        if not result:
            return
        t = self.topics
        enc = self.codec.encode
        p = task.partition
        # Each run names itself in a header too: a worker that cannot decode the value (a
        # newer schema) still answers it FAILED rather than leaving it to its deadline.
        records = [
            _Out(
                t.runs_for(run.queue),
                p,
                run.job_id.encode(),
                enc(run),
                [(RUN_HEADER, run_header(run))],
            )
            for run in result.runs
        ]
        for event in result.status:
            records.append(_Out(t.status, p, event.job_id.encode(), enc(event)))
        for run, reason in result.dead_runs:
            headers = [
                (ERROR_HEADER, _cut(reason, 2000).encode("utf-8", "backslashreplace")),
                (KIND_HEADER, DEAD_RUN_KIND),
            ]
            records.append(_Out(t.dead_letter, p, run.job_id.encode(), enc(run), headers))
        out.extend(records)
        self.meters.output(p, result)
        for problem in result.problems:
            self.meters.refused(problem)
        for run, reason in result.dead_runs:
            self.stats.dead_lettered += 1
            log.info(
                "run dead-lettered",
                extra={
                    "partition": p,
                    "job_id": run.job_id,
                    "run_id": run.run_id,
                    "task": run.task,
                    "attempt": run.attempt,
                    "reason": _cut(reason),
                },
            )

    def _reject(
        self,
        task: PartitionTask,
        record: Record,
        reason: str,
        job_id: str,
        now: int,
        out: list[_Out],
    ) -> None:
        """A command that cannot be applied: a REJECTED event and the record dead-lettered."""
        assert task.processor is not None
        self.stats.rejected += 1
        event_id = f"{record.topic}:{record.partition}:{record.offset}:REJECTED"
        try:
            self._emit(task, task.processor.reject(_cut(job_id), reason, now, event_id), out)
        except Exception:
            log.exception("could not build the REJECTED event", extra={"offset": record.offset})
        self._dead_letter(task, record, reason, out)
        log.warning(
            "request rejected",
            extra={"partition": record.partition, "offset": record.offset, "reason": reason},
        )

    def _dead_letter(
        self, task: PartitionTask, record: Record, reason: str, out: list[_Out]
    ) -> None:
        self.stats.dead_lettered += 1
        self.meters.dead_letter("request" if record.topic == self.topics.requests else "ack")
        headers = [
            # a reason quotes the record's own text: what UTF-8 cannot carry is escaped
            (ERROR_HEADER, _cut(reason, 2000).encode("utf-8", "backslashreplace")),
            (SOURCE_TOPIC_HEADER, record.topic.encode()),
            (SOURCE_PARTITION_HEADER, str(record.partition).encode()),
            (SOURCE_OFFSET_HEADER, str(record.offset).encode()),
        ]
        value = record.value
        if value is not None and len(value) > MAX_DEAD_LETTER_VALUE:
            out.append(self._reference(record.topic, task.partition, record.key, value, headers))
            return
        out.append(_Out(self.topics.dead_letter, task.partition, record.key, value, headers))

    def _reference(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> _Out:
        """A small dead-letter record standing for one too large to copy."""
        return _Out(
            self.topics.dead_letter,
            partition,
            None if key is None else key[:256],
            None,
            [
                *headers,
                (KIND_HEADER, b"too-large"),
                (SIZE_HEADER, str(len(value)).encode()),
                ("jobwheel.topic", topic.encode()),
            ],
        )

    # --- the transaction --------------------------------------------------------------------

    def _commit(self, out: list[_Out], touched: set[int]) -> None:
        assert self.producer is not None and self.input is not None
        producer = self.producer
        now = self.clock.now_ms()
        began = time.perf_counter()
        try:
            producer.begin()
            for record in out:
                self._produce(record)
            for p in touched:
                task = self.tasks.get(p)
                if task is None:
                    continue
                # Only the partition's last changelog record reports its delivery: its offset
                # is the partition's highest (records of a partition arrive in order), the new
                # checkpoint. A report per record cost a Python call each.
                changes = task.state.changes()
                last = len(changes) - 1
                for i, (key, value) in enumerate(changes.items()):
                    self._produce(_Out(self.changelog_topic, p, key, value), track=i == last)
            producer.commit(self._offsets(now), self.input.group_metadata())
        except FencedError as exc:
            self._reset(str(exc))
            return
        except BrokerError as exc:
            self._abort(exc)
            return
        self.stats.transactions += 1
        self.stats.last_commit_ms = now
        self.meters.committed(self.clock.now_ms(), time.perf_counter() - began)
        self._backoff.reset()
        for task in self.tasks.values():
            if task.phase is not Phase.READY:
                continue
            if task.partition in touched:
                offset = producer.changelog_offsets.get(task.partition)
                task.state.commit(None if offset is None else offset + 1)
                task.epoch_committed = True
            if task.requests_next is not None:
                task.requests_committed = task.requests_next
            if task.acks_next is not None:
                task.acks_committed = task.acks_next
            task.acks_seen_committed_ms = task.acks_seen_ms
            task.reached_committed_ms = task.reached_ms
            task.queue_seen_committed = dict(task.queue_seen)
            task.queue_reached_committed = dict(task.queue_reached)
            task.committed_note = task.pending_note

    def _produce(self, record: _Out, track: bool = False) -> None:
        """``track``: see :meth:`TransactionalProducer.produce`. A record replaced by its
        reference is not tracked: the partition's checkpoint then stays where it was, and a
        restore reads this transaction's changelog records again (harmless: the last write
        of a key wins)."""
        assert self.producer is not None
        try:
            self.producer.produce(
                record.topic,
                record.partition,
                record.key,
                record.value,
                record.headers,
                track=track,
            )
        except DeliveryError as exc:  # too large: a reference to it goes to the dead letters
            if record.topic == self.changelog_topic:
                self._changelog_too_large(record, exc)
            log.error(
                "record too large to produce; a reference is dead-lettered",
                extra={"topic": record.topic, "partition": record.partition, "error": str(exc)},
            )
            self.stats.dead_lettered += 1
            self.meters.dead_letter("too-large")
            self.producer.produce(
                *_fields(
                    self._reference(
                        record.topic,
                        record.partition,
                        record.key,
                        record.value or b"",
                        [(ERROR_HEADER, _cut(str(exc), 2000).encode())],
                    )
                )
            )

    def _changelog_too_large(self, record: _Out, exc: DeliveryError) -> None:
        """A job record the producer will not take: never replaced by a reference (the local
        state would keep what no standby and no next owner can read). The limit the
        processors check before they write a record comes down below this one, and the
        transaction is aborted (raises): its batch is processed again, and the change that
        made the record too large is refused then, with its event."""
        size = len(record.key or b"") + len(record.value or b"")
        self._record_limit = min(self._record_limit, size - 1)
        for task in self.tasks.values():
            if task.processor is not None:
                task.processor.max_record_bytes = self._record_limit
        log.error(
            "changelog record too large to produce; the transaction is aborted and the "
            "record limit lowered",
            extra={
                "partition": record.partition,
                "key": _cut((record.key or b"").decode("utf-8", "replace")),
                "size": size,
                "limit": self._record_limit,
                "error": str(exc),
            },
        )
        raise BrokerError(
            f"a {size}-byte changelog record is over what the producer accepts ({exc}); "
            f"job records are now limited to {self._record_limit} bytes "
            "(JOBWHEEL_SCHEDULER_MAX_RECORD_BYTES is above the producer's message.max.bytes "
            "or the changelog topic's max.message.bytes)"
        ) from exc

    def _offsets(self, now: int) -> list[tuple[str, int, int, str]]:
        """The consumed offsets of every ready partition, each with a progress note. Sent in
        every transaction, also unchanged ones: the group then checks this member's
        generation on every commit, which is what fences a member that has been replaced."""
        offsets: list[tuple[str, int, int, str]] = []
        for task in self.tasks.values():
            if task.phase is not Phase.READY:
                continue
            assert task.processor is not None
            task.pending_note = Progress(now, task.processor.next_due_ms(), self._instance)
            note = task.pending_note.encode()
            p = task.partition
            requests = task.requests_next
            if requests is None:
                requests = task.requests_committed
            if requests is None and self.input is not None:
                requests = self.input.position(p)  # nothing read yet: where reading starts
            acks = task.acks_next if task.acks_next is not None else task.acks_committed
            if requests is not None:
                offsets.append((self.topics.requests, p, requests, note))
            if acks is not None:
                offsets.append((self.topics.acks, p, acks, note))
        return offsets

    def _abort(self, cause: BrokerError) -> None:
        """The transaction cannot commit: abort it, forget its changes, read its input again."""
        assert self.producer is not None and self.input is not None and self.acks is not None
        self.stats.aborts += 1
        self.meters.discard()
        retry_in_s = self._backoff.failed()
        log.warning(
            "transaction aborted; processing the batch again",
            extra={"error": str(cause), "retry_in_s": retry_in_s},
        )
        try:
            self.producer.abort()
        except FencedError as exc:
            self._reset(str(exc))
            return
        except BrokerError as exc:
            self._reset(f"abort failed: {exc}")
            return
        for task in self.tasks.values():
            if task.phase is not Phase.READY:
                continue
            task.state.discard()
            if not task.epoch_committed:  # the claim itself must still reach the changelog
                task.state.put(EPOCH_KEY, _EPOCH.pack(task.epoch))
            if task.requests_next is not None:
                self.input.seek(task.partition, _start(task.requests_committed))
                task.requests_next = None
            if task.acks_next is not None:
                self.acks.seek(task.partition, _start(task.acks_committed))
                task.acks_next = None
            task.acks_seen_ms = task.acks_seen_committed_ms  # the rewound acks are unread again
            task.reached_ms = task.reached_committed_ms
            task.queue_seen = dict(task.queue_seen_committed)
            task.queue_reached = dict(task.queue_reached_committed)

    # --- restore ----------------------------------------------------------------------------

    def _restore(self, budget_s: float) -> None:
        """Read the changelog for the partitions that need it: restoring ones first (the
        standby copies' partitions are paused meanwhile), then the standby copies, within
        ``budget_s`` (a slice between iterations while other partitions are processing)."""
        assert self.changelog is not None
        pending = [
            t for t in self.tasks.values() if t.phase is not Phase.READY and not t.restore.reading
        ]
        for task in pending:
            self._start_restore(task)
        reading = {
            t.partition: t
            for t in self.tasks.values()
            if t.phase is not Phase.READY and t.restore.reading
        }
        if not reading:
            return
        restoring = any(t.phase is Phase.RESTORING for t in reading.values())
        for task in reading.values():  # restoring partitions first
            if task.phase is Phase.STANDBY and restoring:
                self.changelog.pause(task.partition)
            else:
                self.changelog.resume(task.partition)
        deadline = time.monotonic() + (budget_s if restoring else STANDBY_SLICE_S)
        while True:
            for task in list(reading.values()):
                position = self.changelog.position(task.partition)
                if position is None or position < task.restore.end:
                    if task.phase is Phase.RESTORING:
                        self._restore_stalled(task.partition, position)
                    continue
                if task.phase is Phase.RESTORING:
                    self._finish_restore(task)
                    reading.pop(task.partition)
                elif task.restore.fresh:  # a new standby copy has caught up: index it
                    rebuild_index(task.backend)
                    task.restore.fresh = False
            if not reading or time.monotonic() >= deadline:
                return
            if restoring and not any(t.phase is Phase.RESTORING for t in reading.values()):
                return  # restored: the standby copies read again from the next iteration on
            by_partition: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
            for p, offset, key, value in self.changelog.poll_changes(20_000, 0.02):
                if p in reading and key is not None:
                    by_partition.setdefault(p, []).append((offset, key, value))
            if not by_partition and not restoring:
                return  # the standby copies are up to date
            for p, batch in by_partition.items():
                task = reading[p]
                applied = apply_batch(
                    task.backend, batch, batch[-1][0] + 1, fresh=task.restore.fresh
                )
                task.restore.applied += applied
                task.restore.next = batch[-1][0] + 1
                self.meters.restored_records += applied
            self.turned_at = time.monotonic()  # a long restore is the loop at work, not hung

    def _start_restore(self, task: Task) -> None:
        """Measure what is left to read, and read it: from the local checkpoint (or from the
        start, when there is none or it does not fit) to the changelog's current end.

        A claim reads the group's committed offsets first, then measures the end. The other
        way round, a previous owner's transaction committing in between (stalled past the
        session timeout, inside its transaction timeout) left this claim with offsets past
        changelog records it never restored: the inputs they covered were lost. Read first
        (``require_stable``: the read waits for a pending transactional offset commit to end),
        every offset seen belongs to a transaction whose changelog records are below the end
        measured afterwards."""
        assert self.changelog is not None
        if isinstance(task, PartitionTask) and not task.offsets_read:
            if not self._read_committed(task):
                return  # try again on the next iteration
        try:
            low, high = self.changelog.watermarks(task.partition)
        except BrokerError as exc:
            # Asked again every iteration: logged when it starts failing (and again after a
            # new changelog consumer), not on every try (the loop would write megabytes a
            # second while the broker answers at once that it does not know).
            if self._restore_stalled(task.partition, None):
                log.warning(
                    "cannot read the changelog's offsets yet",
                    extra={
                        "partition": task.partition,
                        "error": str(exc),
                        "retry": "every iteration; a new changelog consumer after "
                        "JOBWHEEL_SCHEDULER_RESTORE_STALL_MS",
                    },
                )
            return
        self._stalled_since.pop(task.partition, None)
        self.changelog.unassign(task.partition)
        if task.restore.fresh and task.phase is Phase.RESTORING:
            # A standby copy still on its first pass: carry on where it is.
            start = task.backend.checkpoint()
            plan_start, fresh = (start if start is not None else low), True
        else:
            plan = plan_restore(task.backend, low, high)
            plan_start, fresh = plan.start, plan.fresh
        task.restore.end = high
        task.restore.next = plan_start
        task.restore.fresh = fresh
        task.restore.reading = True
        if isinstance(task, PartitionTask):
            log.info(
                "changelog measured",
                extra={"partition": task.partition, "restore_from": plan_start, "end": high},
            )
        if plan_start < high or task.phase is Phase.STANDBY:
            self.changelog.assign(task.partition, plan_start)
        else:
            self._finish_restore(task)

    def _restore_stalled(self, partition: int, position: int | None) -> bool:
        """Note that a restoring partition made no progress (its changelog not measured, or
        read no further than ``position``) and, once one has made none for
        JOBWHEEL_SCHEDULER_RESTORE_STALL_MS, replace the changelog consumer. True when this
        is the first note of this stall (the caller logs it once).

        Whatever holds a consumer back there (a cached metadata answer librdkafka never asks
        again, see ChangelogReader.watermarks; a fetcher that gave up), the loop goes on
        turning, so neither the loop's liveness nor the call watchdog ever sees it: without a
        bound the partition stays "restoring", its jobs unfired, for as long as the client's
        state stays wrong. A new client starts from nothing cached."""
        assert self.changelog is not None
        now = time.monotonic()
        for gone in [p for p in self._stalled_since if p not in self.tasks]:
            del self._stalled_since[gone]  # given up meanwhile: a new claim starts afresh
        seen = self._stalled_since.get(partition)
        if seen is None or seen[0] != position:
            self._stalled_since[partition] = (position, now)
            return True
        stalled_s = now - seen[1]
        if stalled_s < self.settings.scheduler_restore_stall_ms / 1000:
            return False
        log.error(
            "restore made no progress; replacing the changelog consumer",
            extra={
                "partition": partition,
                "position": position,
                "stalled_s": round(stalled_s, 1),
                "setting": "JOBWHEEL_SCHEDULER_RESTORE_STALL_MS",
            },
        )
        self.stats.changelog_rebuilds += 1
        self.changelog.rebuild()
        self._stalled_since.clear()
        return False

    def _read_committed(self, task: PartitionTask) -> bool:
        """The group's committed offsets of the claimed partition (see :meth:`_start_restore`);
        False when the broker cannot tell yet."""
        assert self.input is not None
        p = task.partition
        try:
            requests = self.input.committed(self.topics.requests, [p])[p]
            acks = self.input.committed(self.topics.acks, [p])[p]
        except BrokerError as exc:
            log.warning(
                "cannot read committed offsets yet", extra={"partition": p, "error": str(exc)}
            )
            return False
        task.requests_committed = requests if requests >= 0 else None
        task.acks_committed = acks if acks >= 0 else None
        task.offsets_read = True
        return True

    def _finish_restore(self, task: PartitionTask) -> None:
        assert self.changelog is not None and self.input is not None and self.acks is not None
        self.changelog.unassign(task.partition)
        self._stalled_since.pop(task.partition, None)
        task.restore.reading = False
        p = task.partition
        if task.restore.fresh:
            rebuild_index(task.backend)
            task.restore.fresh = False
        raw = task.backend.jobs.get(EPOCH_KEY)
        task.epoch = (_EPOCH.unpack(raw)[0] if raw else 0) + 1
        task.state.put(EPOCH_KEY, _EPOCH.pack(task.epoch))  # changelogged by the next commit
        task.processor = SchedulerProcessor(
            p,
            task.state,
            fencing_token=task.epoch,
            retention_ms=self.settings.job_retention_ms,
            max_args_bytes=self.settings.max_args_bytes,
            max_active_runs=self.settings.scheduler_max_active_runs,
            max_record_bytes=self._record_limit,
            queues=self.queues,
        )
        self.acks.assign(p, _start(task.acks_committed))
        self.input.resume(p)
        task.committed_note = Progress(self.clock.now_ms(), task.processor.next_due_ms(), "")
        task.phase = Phase.READY
        restore_s = time.monotonic() - task.restore_started
        self.meters.restore.observe(restore_s * 1000)
        log.info(
            "partition ready",
            extra={
                "partition": p,
                "fencing_token": task.epoch,
                "restored_records": task.restore.applied,
                "restore_s": round(restore_s, 3),
                "next_due_ms": task.processor.next_due_ms(),
            },
        )

    # --- visibility -------------------------------------------------------------------------

    def owned(self) -> dict[int, str]:
        """Partition -> phase, for the partitions this process owns (standby copies aside)."""
        return {
            p: t.phase.value for p, t in sorted(self.tasks.items()) if t.phase is not Phase.STANDBY
        }

    def lag(self) -> dict[int, tuple[int, int]]:
        """Per owned partition, input not yet read: ``(requests, acks)`` records, from the end
        offsets of the last fetch responses (no request to the broker)."""
        assert self.input is not None and self.acks is not None
        out: dict[int, tuple[int, int]] = {}
        for task in self.tasks.values():
            if task.phase is Phase.STANDBY:
                continue
            behind = []
            for consumer, pos in (
                (self.input, task.requests_next or task.requests_committed),
                (self.acks, task.acks_next or task.acks_committed),
            ):
                end = consumer.cached_end(task.partition)
                behind.append(max(0, end - pos) if end is not None and pos is not None else 0)
            out[task.partition] = (behind[0], behind[1])
        return out

    def _sample_ends(self) -> None:
        """Every :data:`ENDS_SAMPLE_S`, the held partitions' input end offsets as of the last
        fetch, for the metrics server's thread (lag, stuck partitions). That thread must not
        call a consumer itself: a confluent-kafka consumer blocks other threads' calls while
        one of them polls it."""
        now = time.monotonic()
        if now - self._ends_at < ENDS_SAMPLE_S or self.input is None or self.acks is None:
            return
        self._ends_at = now
        self.input_ends = {
            p: (self.input.cached_end(p), self.acks.cached_end(p))
            for p, t in self.tasks.items()
            if t.phase is not Phase.STANDBY
        }

    def _maybe_log_status(self) -> None:
        """Every minute, when there is something to tell (work done, input waiting, a restore
        going on): which partitions this process owns, in which phase, and how far behind."""
        now = time.monotonic()
        if now - self._last_status_log < STATUS_LOG_INTERVAL_S:
            return
        self._last_status_log = now
        lag = {p: v for p, v in self.lag().items() if any(v)}
        counters = (self.stats.commands, self.stats.fired, self.stats.acks, self.stats.aborts)
        restoring = any(t.phase is Phase.RESTORING for t in self.tasks.values())
        if not lag and not restoring and counters == self._logged_counters:
            return  # idle: nothing to say
        self._logged_counters = counters
        log.info(
            "scheduler status",
            extra={
                "partitions": self.owned(),
                "lag": {p: {"requests": r, "acks": a} for p, (r, a) in lag.items()},
                "commands": self.stats.commands,
                "fired": self.stats.fired,
                "acks": self.stats.acks,
                "transactions": self.stats.transactions,
                "aborts": self.stats.aborts,
            },
        )


def _start(offset: int | None) -> int:
    return offset if offset is not None else NO_OFFSET


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _fields(record: _Out) -> tuple[str, int, bytes | None, bytes | None, list | None]:
    return record.topic, record.partition, record.key, record.value, record.headers


def _dispatched_ms(value: bytes | None) -> int | None:
    """The dispatch time a worker's ack carries in its header (ASCII digits of an int64 ms),
    or None for anything else: no value, other bytes, more digits than any time in ms has
    (and an int64 holds)."""
    if not isinstance(value, bytes) or not value.isdigit() or len(value) > 18:
        return None
    return int(value)


def _header(record: Record, name: str) -> str | None:
    for key, value in record.headers or ():
        if key == name:
            return (value or b"").decode("utf-8", "replace")[:200]
    return None
