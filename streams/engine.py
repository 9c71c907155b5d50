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
   larger transactions; ``..._BACKLOG_COMMIT_INTERVAL_MS`` while the input or the due timers
   are behind); an iteration that finds nothing more to do commits at once.

**The acks watermark.** A visibility deadline expires only once the acks partition has been
read past it: the watermark is the broker append time of the latest ack read from the partition.
So a scheduler that lags never re-dispatches a run whose SUCCEEDED or HEARTBEAT is already on
the topic. And since acks partition ``p`` is written by the worker that owns runs partition
``p``, the watermark is also that worker's sign of life: while the partition's worker side is
stalled (its worker killed and the group rebalancing, or no worker at all), no deadline expires
and nothing is re-dispatched into a queue that nobody reads; Kafka itself redelivers the
unfinished runs to the partition's next worker (workers commit only finished runs).

**The rooms.** This module is the loop: :class:`SchedulerEngine`'s run and its iteration (poll,
the commands and acks handed to each partition's processor, punctuation with its deadline
watermarks, when to commit). The rest of the engine is mixed into the same class, each part in
a module of its own on a shared core (:mod:`jobwheel.streams.core`, the state they all use), as
Kafka Streams splits the same work:

- :mod:`jobwheel.streams.tasks` (its TaskManager): the partitions this process holds, owned or
  kept as standby copies, and the transitions between them (assign, revoke, lose, claim,
  standby);
- :mod:`jobwheel.streams.restore` (its StoreChangelogReader): reading the changelog, for the
  restore of a claimed partition and for the standby copies;
- :mod:`jobwheel.streams.commit`: the transaction (its records; begin, produce, commit), what an
  abort undoes, and the reset after a fatal producer error or a fence.

The names of those modules that other parts and the tests use are importable from here too.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from jobwheel.clock import clamp_ms
from jobwheel.errors import (
    BrokerError,
    FencedError,
    JobwheelError,
    SchemaDecodeError,
    ValidationError,
)
from jobwheel.schemas.deadletter import REPLAYED_FROM_HEADER, note_replay
from jobwheel.schemas.models import JobCommand, StatusEvent
from jobwheel.schemas.partitioning import partition_for
from jobwheel.schemas.topics import (
    DEFAULT_QUEUE,
    DISPATCHED_HEADER,
    QUEUE_HEADER,
    STATE_HEADER,
)
from jobwheel.schemas.validation import check_key
from jobwheel.streams.commit import MAX_DEAD_LETTER_VALUE, Committer, _Out
from jobwheel.streams.core import EngineStats, _cut, log
from jobwheel.streams.kafka import (
    AcksConsumer,
    ChangelogReader,
    InputConsumer,
    Record,
    TransactionalProducer,
)
from jobwheel.streams.restore import RESTORE_SLICE_S, STANDBY_SLICE_S, Restorer
from jobwheel.streams.tasks import (
    PartitionTask,
    Phase,
    RestoreProgress,
    StandbyTask,
    Task,
    TaskManager,
)

__all__ = [
    "ENDS_SAMPLE_S",
    "IDLE_WAIT_S",
    "MAX_DEAD_LETTER_VALUE",
    "MAX_TRANSACTION_RECORDS",
    "RESTORE_SLICE_S",
    "SKIPPED_ACKS",
    "STANDBY_SLICE_S",
    "STATUS_LOG_INTERVAL_S",
    "EngineStats",
    "PartitionTask",
    "Phase",
    "RestoreProgress",
    "SchedulerEngine",
    "StandbyTask",
    "Task",
    "_Out",
]

#: Longest poll when nothing is due: acks are read at least this often.
IDLE_WAIT_S = 0.1
#: Acks whose state changes nothing the scheduler decides on; skipped by header, not decoded.
SKIPPED_ACKS = {b"STALE"}
#: Records one transaction may carry from punctuation: a partition far behind (a day of
#: downtime, a burst of due jobs) is worked off over several transactions, and the consumer is
#: polled between them.
MAX_TRANSACTION_RECORDS = 20_000
STATUS_LOG_INTERVAL_S = 60.0
#: How often the loop samples its inputs' end offsets for the metrics (lag, stuck partitions).
ENDS_SAMPLE_S = 0.5


class SchedulerEngine(TaskManager, Restorer, Committer):
    """One scheduler process's consume-process-produce loop (see the module doc), with its
    rooms mixed in: :class:`~jobwheel.streams.tasks.TaskManager`,
    :class:`~jobwheel.streams.restore.Restorer` and :class:`~jobwheel.streams.commit.Committer`,
    on the shared state of :class:`~jobwheel.streams.core.EngineCore`."""

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
        client = self._client_id()
        self.joined = False
        self.producer = self._registered_producer()
        if self.producer is None:
            return  # stopped meanwhile
        self.input = InputConsumer(self.settings, client, self.watchdog)
        self.acks = AcksConsumer(self.settings, client + "-acks")
        self.changelog = ChangelogReader(self.settings, client + "-restore")
        self.input.subscribe(self._on_assign, self._on_revoke, self._on_lost)

    def _client_id(self) -> str:
        return f"{self.settings.scheduler_app_id}-{self._instance}"

    def _registered_producer(self) -> TransactionalProducer | None:
        """A new transactional producer, registered with its coordinator (init_transactions,
        which also ends whatever transaction the previous one left open); None when the
        engine was stopped meanwhile. While the broker is unreachable this waits: there is
        nothing to commit to."""
        client = self._client_id()
        producer = TransactionalProducer(self.settings, client, self.watchdog)
        # Asked again of the same producer for a bounded time only: a client that timed out
        # for that long may hold a coordinator it will not look up again (init_transactions
        # was seen timing out for over a minute after the broker was back); a new one asks.
        fresh_after_s = self.settings.scheduler_init_fresh_after_ms / 1000
        since = time.monotonic()
        while True:
            self.turned_at = time.monotonic()
            try:
                producer.init(give_up_s=fresh_after_s)
                return producer
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
                    producer.close()
                    producer = TransactionalProducer(self.settings, client, self.watchdog)
                    since = time.monotonic()
                if self._stop.wait(2.0):
                    producer.close()
                    return None

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

    # --- the loop ---------------------------------------------------------------------------

    def step(self) -> None:
        """One iteration: poll, process, punctuate, commit (see the module doc)."""
        assert self.input is not None and self.acks is not None
        self.turned_at = time.monotonic()
        try:
            requests = self.input.poll(self.settings.scheduler_max_batch, self._wait_s())
            acks = self.acks.poll(self.settings.scheduler_max_batch, 0)
        except FencedError as exc:
            self._reset(str(exc), rejoin=True)  # the consumer's own error: it is replaced too
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
        stuck = self.stuck_claim()
        if stuck is not None:  # what was polled is read again from the committed offsets
            self._reset(stuck, rejoin=True)
            return
        self._standby_all()
        self._observe_broker_time(requests, acks)
        now = self.clock.now_ms()
        out, touched = self._out, self._touched
        for record in requests:
            self._on_request(record, now, out, touched)
        for record in acks:
            self._on_ack(record, now, out, touched)
        self._note_ends_reached()
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
            # Under load, iterations share a transaction for up to the commit interval (the
            # backlog interval while a poll comes back full or due timers wait for the next
            # batch): fewer, larger transactions. When an iteration found nothing more to do,
            # commit at once.
            batch = self.settings.scheduler_max_batch
            if len(requests) >= batch or len(acks) >= batch or any(t.behind for t in ready):
                self._txn_backlog = True
            idle = not (requests or acks or handled)
            if (
                idle
                or len(out) >= MAX_TRANSACTION_RECORDS
                or time.monotonic() - self._txn_since >= self._txn_interval_s()
                or self._stop.is_set()
            ):
                self._commit_pending()
        else:
            self._backoff.reset()
        self._sample_ends()
        self._maybe_log_status()

    def _observe_broker_time(self, requests: list[Record], acks: list[Record]) -> None:
        """Tell the clock the broker's time: the append time of a partition's last record read,
        when that record is at the end of the partition and was appended after this ownership
        had read the partition to its end (:meth:`_note_ends_reached`). Neither a backlog's
        records nor the last record of a quiet partition read by a new owner (appended before
        it started, and as old as the partition is quiet) say what time it is now."""
        assert self.input is not None and self.acks is not None
        for consumer, batch, of_acks in ((self.input, requests, False), (self.acks, acks, True)):
            last: dict[int, Record] = {}
            for record in batch:
                if record.broker_time:
                    last[record.partition] = record
            for p, record in last.items():
                task = self._ready(record)
                if task is None:
                    continue
                live = task.acks_live_from if of_acks else task.requests_live_from
                if live is None or record.offset < live:
                    continue
                end = consumer.cached_end(p)
                if end is not None and record.offset + 1 >= end:
                    self.clock.observe(record.timestamp_ms)

    def _note_ends_reached(self) -> None:
        """Note where each ready partition's inputs have been read to their end, once per
        ownership (see :meth:`_observe_broker_time`). After the iteration's records are
        processed, so that a partition busy in every iteration is caught up with too; and only
        once this ownership has read a record of the input, so that the end compared is one
        a fetch of this ownership brought (the client caches a partition's end across its
        assignments, and a cached end older than the ownership's start offset could equal it:
        the next records would pass for fresh)."""
        assert self.input is not None and self.acks is not None
        for task in self.tasks.values():
            if task.phase is not Phase.READY:
                continue
            p = task.partition
            if task.requests_live_from is None and task.requests_next is not None:
                if self.input.cached_end(p) == task.requests_next:
                    task.requests_live_from = task.requests_next
            if task.acks_live_from is None and task.acks_next is not None:
                if self.acks.cached_end(p) == task.acks_next:
                    task.acks_live_from = task.acks_next

    def _txn_interval_s(self) -> float:
        """How long the open transaction may keep growing (see :meth:`step`)."""
        return self._backlog_interval_s if self._txn_backlog else self._commit_interval_s

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
            wait = max(0.0, self._txn_interval_s() - (time.monotonic() - self._txn_since))
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
        commands = self._clamp_lines.due()
        if commands:
            log.warning(
                "command issue time clamped to the broker's time",
                extra={
                    "partition": record.partition,
                    "offset": record.offset,
                    "job_id": _cut(cmd.job_id),
                    "issued_at_ms": cmd.issued_at_ms,
                    "broker_ms": record.timestamp_ms,
                    "skew_ms": cmd.issued_at_ms - record.timestamp_ms,
                    "commands": commands,  # this one and those clamped since the last line
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
        due = task.processor.next_due_ms(watermark)
        if due is None or due > now:  # nothing due: most partitions, most iterations
            task.behind = False
            if task.state.dirty:
                touched.add(task.partition)
            return 0
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

    # --- visibility -------------------------------------------------------------------------

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
