"""The status sink: status and acks topics -> ClickHouse ``status_events``, in batches, at least
once.

The scheduler's events come on the status topic and the workers' on the acks topic; an event's
``source`` column is taken from the topic it came on, never from the record's own ``source``
field (any writer can set a field; only the topic's ACLs say who wrote it).

Offsets are committed only after the batch holding them is inserted, so a crash loses
nothing: the uncommitted records are read again. Reading them again is harmless because the
table is deduplicated by ``event_id`` (ReplacingMergeTree, read with FINAL/argMax; see
migrations/0001), and a retried insert of the very same batch is dropped on the spot by its
``insert_deduplication_token`` (topic, partitions and offset ranges). So a replayed batch
neither doubles nor loses rows.

Records are decoded straight into ``status_events`` rows (:class:`EventRows`: field values from
the codec's fast path, no model objects) and inserted column by column. A worker's verdict
that carries ``started_ms`` (a quick run sends no STARTED of its own) also yields the run's
STARTED row, with the same event id a STARTED record would have had.

The scheduler's events mostly come several to a record (a ``StatusBatch``, one per partition
and transaction; schemas/README.md): each of its events is decoded and judged on its own.

A record that does not decode (foreign producer, future schema, garbage) or whose values do
not fit the table is logged with the reason, counted in :class:`SinkStats` and skipped (its
offset is committed with the batch), never fatal: one bad record never stops a partition. An event
whose ``seq`` lies beyond any value a scheduler can write (:data:`SEQ_AHEAD_LIMIT_MS`) is refused
the same way and counted on its own (``jobwheel_sink_seq_refused_total``): the job and run
views take the state of the highest ``seq``, so one forged event with ``seq`` 2^62 would
otherwise decide a job's state for good. An insert
that fails (ClickHouse down) is retried with backoff, holding the batch and its offsets, until
it succeeds or the sink is stopped; nothing is committed meanwhile.

Threading: a confluent-kafka consumer is used from one thread, so :meth:`StatusSink.run`
owns it from start to close; :meth:`StatusSink.stop` only sets an event. The rebalance
callbacks run inside ``consume()`` on that thread and flush the batch before partitions go.
Inserts run on one helper thread with at most one batch in flight, so decoding batch N+1
overlaps inserting batch N (decoding costs about as much as inserting). Offsets of batch N are
committed by the consumer thread once its insert returned, and batches are committed in order;
if an insert is abandoned (stop during a ClickHouse outage) nothing is committed afterwards, so
no later offset can skip the abandoned records.

The consumer's blocking calls (the synchronous offset commit, which librdkafka gives no
timeout, and close) run under a :class:`~jobwheel.watchdog.CallWatchdog`
(``JOBWHEEL_STATUS_CALL_DEADLINE_MS``): a call that never returns (a coordinator request lost
in a broker restart) ends the process for its supervisor to restart, instead of holding the
sink's partitions with nothing inserted. Safe for the reason above: uncommitted records are read
again and deduplicated.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from jobwheel.consumers.status.memory import (
    StatusMemory,
    limit_heap_growth,
    release_freed_memory,
)
from jobwheel.consumers.status.metrics import SinkCollector, SinkMeters
from jobwheel.consumers.status.store import EVENT_COLUMNS, StatusStore, event_row, row_fits
from jobwheel.errors import BrokerError, SchemaDecodeError, StoreError
from jobwheel.kafka.consumer import GroupConsumer, committing_consumer_config
from jobwheel.retry import Backoff
from jobwheel.schemas.codec import Codec, default_codec
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.watchdog import CallWatchdog, kafka_reachable

if TYPE_CHECKING:
    from jobwheel.settings import Settings

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 5.0
_SWITCH_INTERVAL_S = 0.0005
#: How often the consumer thread samples its partitions' lag for the metrics.
_LAG_SAMPLE_S = 0.5
#: How often, at most, freed C heap memory is given back after a batch is done (see memory.py).
_RELEASE_S = 5.0


@dataclass
class SinkStats:
    """Counters for /health and logs (read from other threads; plain ints are fine)."""

    consumed: int = 0
    inserted: int = 0
    undecodable: int = 0
    last_undecodable: str | None = None
    #: Events refused for a ``seq`` no scheduler writes (see :data:`SEQ_AHEAD_LIMIT_MS`).
    seq_refused: int = 0
    batches: int = 0
    insert_failures: int = 0
    commit_failures: int = 0
    last_insert_ms: int | None = None
    last_error: str | None = None
    running: bool = False
    assigned: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_due_ms(rows: int, batch_ms: int, busy_rows: int, busy_batch_ms: int) -> int:
    """How old a batch of ``rows`` may grow before it is inserted: ``batch_ms``, or
    ``busy_batch_ms`` (never less) once it holds ``busy_rows`` (see
    :meth:`StatusSink._batch_due_ms`; ``load.store_bench`` picks its interval by it)."""
    return max(batch_ms, busy_batch_ms) if rows >= busy_rows else batch_ms


def consumer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """The sink's consumer settings over the pass-through ``kafka_config``.

    Manual commits only (the at-least-once rule above depends on it); ``read_committed`` so a
    fenced scheduler's aborted transaction never shows up as status. These override the
    pass-through; the session timeout is only a default (10 s instead of librdkafka's 45 s, so
    the partitions of a crashed sink move to a live one quickly; heartbeats come from
    librdkafka's own thread, so a slow insert does not expire the session), and so is the
    fetch queue's size, a share of ``JOBWHEEL_STATUS_MEMORY_MIB`` (see memory.py), and the
    cooperative assignor (a static member assigns eagerly instead: with_static_assignor).
    """
    defaults = {
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 2_000,
        "queued.max.messages.kbytes": StatusMemory.from_settings(settings).fetch_queue_kib,
        "partition.assignment.strategy": "cooperative-sticky",
    }
    forced = {
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }
    return committing_consumer_config(
        settings, settings.status_group, defaults, "status", **{**forced, **overrides}
    )


class BadRecord(Exception):
    """A record the sink skips; the message says why."""


class ImplausibleSeq(BadRecord):
    """An event whose ``seq`` no scheduler could have given it (a forged or corrupt record)."""


#: How far past the sink's own clock (epoch ms) an event's ``seq`` may lie. A job's ``seq``
#: counts its events from 1, except that a job the scheduler had forgotten and recreates for a
#: dead-letter replay continues from the command's issue time (streams/rules/commands.py), so
#: the largest ``seq`` a scheduler writes is about "now" plus the issuing client's clock skew.
#: A day covers any skew; the bound is stateless, so it holds the same after a sink restart
#: and on any partition assignment. A forged ``seq`` below it still sorts high: only ACLs
#: (only the scheduler writes ``status``) close that (README, "Kafka ACLs").
SEQ_AHEAD_LIMIT_MS = 24 * 3600 * 1000


_STATUS_EVENT = "io.jobwheel.StatusEvent"
_WIRE_COLUMNS = EVENT_COLUMNS[:-2]  # the rest (kafka_partition, kafka_offset) are the sink's
_SOURCE = EVENT_COLUMNS.index("source")
_STATE = EVENT_COLUMNS.index("state")
_SEQ = EVENT_COLUMNS.index("seq")
_JOB_ID = EVENT_COLUMNS.index("job_id")
_QUEUE = EVENT_COLUMNS.index("queue")
_VERDICTS = frozenset({State.SUCCEEDED.value, State.FAILED.value})


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class EventRows:
    """Record bytes -> ``status_events`` rows, in :data:`EVENT_COLUMNS` order.

    The common case costs one pass over the bytes: the codec's fast path returns the field
    values, and a writer schema whose fields start with the table's columns in order (every
    version so far) becomes a row by slicing. Anything else goes through the full decode and
    :func:`row_fits`, so a row that reaches a batch can always be inserted.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._plans: dict[tuple[str, ...], tuple[tuple[int, ...] | None, int]] = {}
        #: The highest ``seq`` accepted (epoch ms); the sink moves it on with its clock.
        self.seq_ceiling = _wall_ms() + SEQ_AHEAD_LIMIT_MS

    def rows(
        self, value: bytes | None, source: str, partition: int, offset: int
    ) -> list[list[Any]]:
        """The row of the event in ``value`` (two for a verdict with ``started_ms``); raises
        :class:`BadRecord` (:class:`ImplausibleSeq` for a ``seq`` past :attr:`seq_ceiling`) or
        :class:`SchemaDecodeError` saying why there is none."""
        rows = self._rows(value, source, partition, offset)
        seq = rows[0][_SEQ]
        if seq > self.seq_ceiling:
            raise ImplausibleSeq(
                f"seq {seq} of job {rows[0][_JOB_ID]!r} is beyond any sequence number a scheduler "
                f"writes (at most the current time in ms plus {SEQ_AHEAD_LIMIT_MS // 3_600_000} "
                "h): a forged or corrupt event; restrict who may write the status and acks "
                "topics with ACLs (`jobwheel acls apply`)"
            )
        return rows

    def _rows(
        self, value: bytes | None, source: str, partition: int, offset: int
    ) -> list[list[Any]]:
        if value is None:
            raise BadRecord("the record has no value (a tombstone?)")
        fields = self.codec.decode_fields(value)
        if fields is None:
            return self._slow(value, source, partition, offset)
        name, names, values = fields
        if name != _STATUS_EVENT:
            raise BadRecord(f"expected a StatusEvent, got a {name.rsplit('.', 1)[-1]}")
        plan = self._plans.get(names)
        if plan is None:
            plan = self._plan(names)
        columns, started_at = plan
        if columns is None:  # the writer's fields start with the table's columns, in order
            row = values[: len(_WIRE_COLUMNS)]
        else:
            row = [None if i < 0 else values[i] for i in columns]
        row.append(partition)
        row.append(offset)
        row[_SOURCE] = source
        started_ms = values[started_at] if started_at >= 0 else None
        if started_ms is None or row[_STATE] not in _VERDICTS:
            return [row]
        return [row, _started_row(row, started_ms)]

    def _plan(self, names: tuple[str, ...]) -> tuple[tuple[int, ...] | None, int]:
        missing = [c for c in ("event_id", "job_id", "state", "event_time_ms") if c not in names]
        if missing:
            raise BadRecord(f"a StatusEvent schema without {missing}")
        if names[: len(_WIRE_COLUMNS)] == _WIRE_COLUMNS:
            columns = None
        else:
            columns = tuple(names.index(c) if c in names else -1 for c in _WIRE_COLUMNS)
        plan = (columns, names.index("started_ms") if "started_ms" in names else -1)
        self._plans[names] = plan
        return plan

    def _slow(self, value: bytes, source: str, partition: int, offset: int) -> list[list[Any]]:
        """Other framings (Confluent wire format), older writers, odd but legal bytes."""
        event = self.codec.decode(value)  # SchemaDecodeError says what is wrong
        if not isinstance(event, StatusEvent):
            raise BadRecord(f"expected a StatusEvent, got a {type(event).__name__}")
        row = event_row(event, partition, offset, source=source)
        problem = row_fits(row)
        if problem is not None:
            raise BadRecord(f"the event does not fit the status table: {problem}")
        if event.started_ms is None or row[_STATE] not in _VERDICTS:
            return [row]
        started = _started_row(row, event.started_ms)
        problem = row_fits(started)
        if problem is not None:
            raise BadRecord(f"started_ms does not fit the status table: {problem}")
        return [row, started]


def _started_row(verdict: list[Any], started_ms: int) -> list[Any]:
    """The STARTED row a quick run's verdict stands for (the worker did not send one)."""
    (_, job_id, run_id, seq, attempt, _, _, source, task, scheduled, worker, *_rest) = verdict
    return [
        f"{run_id}:{attempt}:STARTED",
        job_id,
        run_id,
        seq,
        attempt,
        State.STARTED.value,
        started_ms,
        source,
        task,
        scheduled,
        worker,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        verdict[_QUEUE],
        verdict[-2],
        verdict[-1],
    ]


class _Batch:
    """Decoded rows plus the offset range of every record read (decodable or not), per
    ``(topic, partition)``."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self.ranges: dict[tuple[str, int], list[int]] = {}  # [lowest, highest]
        self.started = time.monotonic()

    def add_offset(self, topic: str, partition: int, offset: int) -> None:
        span = self.ranges.get((topic, partition))
        if span is None:
            self.ranges[(topic, partition)] = [offset, offset]
        elif offset > span[1]:
            span[1] = offset
        elif offset < span[0]:
            span[0] = offset

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def token(self) -> str:
        return ",".join(f"{t}/{p}:{lo}-{hi}" for (t, p), (lo, hi) in sorted(self.ranges.items()))


class StatusSink:
    """Consume the status and acks topics into the store until stopped (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        store: StatusStore,
        *,
        codec: Codec | None = None,
        batch_size: int | None = None,
        batch_ms: int | None = None,
        consumer_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        #: topic -> the ``source`` of every event read from it
        self.sources = {settings.topics.status: "scheduler", settings.topics.acks: "worker"}
        self.codec = codec or default_codec(settings.schema_registry_url)
        memory = StatusMemory.from_settings(settings)
        #: Rows per batch: the setting, at most what the memory budget allows (two batches
        #: are alive at once, one filling while the other is inserted).
        self.batch_size = min(batch_size or settings.status_batch_size, memory.batch_rows)
        self.batch_ms = batch_ms if batch_ms is not None else settings.status_batch_ms
        #: A batch this large at ``batch_ms`` marks the sink busy: it then waits until
        #: ``busy_batch_ms`` (never sooner than ``batch_ms``; see :meth:`_batch_due_ms`).
        self.busy_rows = settings.status_busy_rows
        self.busy_batch_ms = max(self.batch_ms, settings.status_busy_batch_ms)
        self.stats = SinkStats()
        self._overrides = dict(consumer_overrides or {})
        self._stop = threading.Event()
        self._batch = _Batch()
        self._consumer: GroupConsumer | None = None
        self._inserter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="status-insert")
        self._inflight: tuple[_Batch, Future[bool]] | None = None
        self._abandoned = False  # an insert gave up: commit nothing more in this run
        self._owned: set[tuple[str, int]] = set()
        self._rows = EventRows(self.codec)
        # Metrics and health (jobwheel_sink_*, served when JOBWHEEL_METRICS_PORT is set).
        self.meters = SinkMeters()
        self.joined = False
        self._lag_at = 0.0
        self._released_at = 0.0
        self._engine_released_at = 0.0
        self.watchdog = CallWatchdog(
            settings.status_call_deadline_ms / 1000,
            what="status sink",
            setting="JOBWHEEL_STATUS_CALL_DEADLINE_MS",
            reachable=kafka_reachable(settings),
        )

    # --- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Consume until :meth:`stop`; flush what was read, then leave the group."""
        limit_heap_growth()  # before librdkafka's and the inserter's threads (memory.py)
        consumer = GroupConsumer(
            consumer_config(self.settings, **self._overrides),
            "jobwheel.consumers.status",
            "status sink consumer",
        )
        self._consumer = consumer
        if getattr(self.store, "embedded", False) and sys.getswitchinterval() > _SWITCH_INTERVAL_S:
            # The embedded engine takes the GIL back several times per insert, and each time
            # waits out the decoding thread's switch interval (5 ms by default): measured, that
            # halved the insert rate. A shorter interval lets decoding and inserting overlap.
            sys.setswitchinterval(_SWITCH_INTERVAL_S)
        consumer.subscribe(
            list(self.sources),
            on_assign=lambda pairs: self._on_assign(consumer, pairs),
            on_revoke=lambda pairs: self._on_revoke(consumer, pairs),
            on_lost=lambda pairs: self._on_lost(consumer, pairs),
        )
        self.stats.running = True
        uninstall = SinkCollector(self).install()
        log.info(
            "status sink started",
            extra={"topics": list(self.sources), "group": self.settings.status_group},
        )
        try:
            while not self._stop.is_set():
                self._poll_once(consumer)
            self._flush(consumer)
        finally:
            uninstall()
            self.stats.running = False
            self._inserter.shutdown(wait=True)
            try:
                with self.watchdog.watch("closing the status sink consumer"):
                    consumer.close()
            except Exception as exc:  # closing must not hide the reason we stopped
                log.warning("status sink consumer close failed", extra={"error": str(exc)})
            self.watchdog.close()
            self._consumer = None
            log.info("status sink stopped", extra=self.stats.as_dict())

    def start_thread(self) -> threading.Thread:
        """Run in a daemon thread (``jobwheel serve`` in embedded mode)."""
        thread = threading.Thread(target=self._run_logged, name="jobwheel-status-sink", daemon=True)
        thread.start()
        return thread

    def _run_logged(self) -> None:
        try:
            self.run()
        except Exception as exc:
            self.stats.last_error = f"sink stopped: {exc}"
            log.exception("status sink thread died")

    # --- the loop ----------------------------------------------------------------------------

    def _poll_once(self, consumer: GroupConsumer) -> None:
        if self._inflight is not None and self._inflight[1].done():
            self._finish_inflight(consumer, set())  # commit promptly even when no more arrives
        wait_s = 1.0 if self._inflight is None else 0.05
        if self._batch and self._inflight is None:
            age_ms = (time.monotonic() - self._batch.started) * 1000
            wait_s = min(wait_s, max(0.0, (self._batch_due_ms() - age_ms) / 1000))
        room = max(1, self.batch_size - len(self._batch.rows))
        for record in consumer.consume(min(room, 10_000), min(wait_s, 1.0)):
            self.handle(record.topic, record.partition, record.offset, record.value)
        if time.monotonic() - self._lag_at >= _LAG_SAMPLE_S:
            self._lag_at = time.monotonic()
            self._rows.seq_ceiling = _wall_ms() + SEQ_AHEAD_LIMIT_MS
            self.meters.lag = consumer.lag()
        if not self._batch:
            return
        full = len(self._batch.rows) >= self.batch_size
        due = (time.monotonic() - self._batch.started) * 1000 >= self._batch_due_ms()
        # A batch that is due while the previous insert is still running keeps growing until
        # that insert returns (or it is full): under load the batches size themselves to the
        # insert time, and an embedded insert costs much less per row in large batches
        # (measured: 27 us per row at 5,000 rows, 16 at 20,000, 11 at 60,000). Idle or light,
        # nothing is in flight and the batch goes at ``batch_ms`` as before.
        busy = self._inflight is not None and not self._inflight[1].done()
        if full or (due and not busy):
            self._flush(consumer, wait=False)

    def _batch_due_ms(self) -> int:
        """How old the open batch may grow before it is inserted: ``batch_ms``, or
        ``busy_batch_ms`` once it holds ``busy_rows``.

        Why: an embedded insert costs about 40 ms of CPU whatever its size (measured: 36 ms
        for 5 rows, 80 for 5,000; the two materialized views' queries and a part per table),
        about 10 us per row on top, and its parts are merged again later. A busy sink that
        inserted twice a second paid that on every batch; four times fewer inserts took a
        tenth to a fifth off its CPU per job (BENCHMARKS.md, "The status sink's inserts under
        load"). A light sink keeps its batches at ``batch_ms``: what users look at stays
        fresh where fresh is cheap."""
        return batch_due_ms(
            len(self._batch.rows), self.batch_ms, self.busy_rows, self.busy_batch_ms
        )

    def handle(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        """One record of ``topic``: its rows go into the batch, or it is logged with the reason
        and counted as undecodable; a StatusBatch's events each so, on their own. Never
        raises: no record can stop the sink."""
        batch = self._batch
        if not batch:
            batch.started = time.monotonic()
        batch.add_offset(topic, partition, offset)
        self.stats.consumed += 1
        try:
            items = None if value is None else self.codec.batch_items(value)
        except SchemaDecodeError as exc:
            self._skipped(topic, partition, offset, self._undecodable(str(exc)))
            return
        if items is None:
            problem = self._event(topic, partition, offset, value)
            if problem is not None:
                self._skipped(topic, partition, offset, problem)
            return
        # One line for a batch's skipped events, however many: one hostile record of empty
        # items (a million in a megabyte) must not flood the log.
        problems = [p for p in (self._event(topic, partition, offset, i) for i in items) if p]
        if problems:
            self._skipped(topic, partition, offset, problems[0], len(problems), len(items))

    def _event(
        self, topic: str, partition: int, offset: int, value: bytes | None
    ) -> tuple[str, str] | None:
        """Put the rows of one event in the batch and None, or count it skipped and say why:
        ``("refused", reason)`` (an implausible ``seq``) or ``("undecodable", reason)``."""
        try:
            rows = self._rows.rows(value, self.sources[topic], partition, offset)
        except ImplausibleSeq as exc:
            self.stats.seq_refused += 1
            return "refused", str(exc)
        except (BadRecord, SchemaDecodeError) as exc:
            return self._undecodable(str(exc))
        except Exception as exc:  # a reader bug must not stop the partition either
            return self._undecodable(f"{type(exc).__name__}: {exc}")
        self._batch.rows += rows
        return None

    def _undecodable(self, reason: str) -> tuple[str, str]:
        """Count a record or event that does not decode, or does not fit; its problem."""
        self.stats.undecodable += 1
        self.stats.last_undecodable = reason[:500]
        return "undecodable", reason

    def _skipped(
        self,
        topic: str,
        partition: int,
        offset: int,
        problem: tuple[str, str],
        count: int = 1,
        of: int = 0,
    ) -> None:
        kind, reason = problem
        extra: dict[str, Any] = {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "error": reason,
        }
        if of:
            extra.update(skipped=count, events=of, first=kind)  # error: the first one's reason
            message = "status events of a batch skipped"
        elif kind == "refused":
            message = "status event refused"
        else:
            message = "undecodable status record skipped"
        log.warning(message, extra=extra)

    def _flush(
        self, consumer: GroupConsumer, lost: set[tuple[str, int]] | None = None, wait: bool = True
    ) -> None:
        """Hand the batch to the inserter (after finishing the one in flight); with ``wait``,
        also finish this one, so nothing read is left uninserted or uncommitted."""
        lost = lost or set()
        if self._batch:
            self._finish_inflight(consumer, lost)
            batch, self._batch = self._batch, _Batch()
            self._inflight = (batch, self._inserter.submit(self._insert, batch))
        if wait:
            self._finish_inflight(consumer, lost)

    def _finish_inflight(self, consumer: GroupConsumer, lost: set[tuple[str, int]]) -> None:
        if self._inflight is None:
            return
        batch, future = self._inflight
        self._inflight = None
        if not future.result():
            self._abandoned = True
        if self._abandoned:
            return  # not inserted (or an earlier batch was not): its records are read again
        self._commit(consumer, batch, lost)
        del batch  # its rows are freed here, before their memory is given back
        if time.monotonic() - self._released_at >= _RELEASE_S:
            self._released_at = time.monotonic()
            release_freed_memory()

    def _insert(self, batch: _Batch) -> bool:
        """On the inserter thread: True once inserted, False if stopped before it could be."""
        if not batch.rows:
            return True  # only undecodable records: nothing to insert, offsets to commit
        backoff = Backoff(start_s=0.2, max_s=_MAX_BACKOFF_S)
        while True:
            try:
                began = time.perf_counter()
                self.store.insert_events(batch.rows, dedup_token=batch.token())
                self.meters.inserted(len(batch.rows), time.perf_counter() - began)
                self.stats.inserted += len(batch.rows)
                self.stats.batches += 1
                self.stats.last_insert_ms = time.time_ns() // 1_000_000
                self._release_engine_memory()
                return True
            except StoreError as exc:
                self.stats.insert_failures += 1
                self.meters.failed()
                self.stats.last_error = str(exc)[:500]
                delay_s = backoff.failed()
                log.error(
                    "status insert failed; retrying, offsets not committed",
                    extra={"rows": len(batch.rows), "error": str(exc)[:500], "retry_s": delay_s},
                )
                if self._stop.wait(delay_s):
                    return False  # not inserted, not committed: the next owner reads it again
            except Exception as exc:  # a bug or a bad row: keep the records for the next run
                self.stats.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.exception("status insert crashed; stopping the sink, offsets not committed")
                self._stop.set()
                return False

    def _release_engine_memory(self) -> None:
        """On the inserter thread, which is the store's only other user here (a call on the
        consumer thread would wait for the insert in flight), at most every ``_RELEASE_S``."""
        if time.monotonic() - self._engine_released_at < _RELEASE_S:
            return
        self._engine_released_at = time.monotonic()
        try:
            self.store.release_engine_memory()
        except Exception as exc:  # housekeeping: the insert went through, whatever this does
            log.debug("engine memory not released", extra={"error": str(exc)[:500]})

    def _commit(self, consumer: GroupConsumer, batch: _Batch, lost: set[tuple[str, int]]) -> None:
        offsets = {
            (t, p): hi + 1 for (t, p), (_, hi) in sorted(batch.ranges.items()) if (t, p) not in lost
        }
        if not offsets:
            return
        try:
            with self.watchdog.watch("committing the status sink's offsets"):
                consumer.commit(offsets, asynchronous=False)
        except BrokerError as exc:
            # Lost ownership in a rebalance: the new owner re-reads these records and the
            # event_id dedup absorbs the copies. Nothing to undo here.
            self.stats.commit_failures += 1
            log.warning(
                "status offsets not committed; the records will be read again",
                extra={
                    "error": str(exc),
                    "offsets": {f"{t}/{p}": offset for (t, p), offset in offsets.items()},
                },
            )

    # --- rebalance ---------------------------------------------------------------------------

    def _on_assign(self, consumer: GroupConsumer, partitions: list[tuple[str, int]]) -> None:
        self.joined = True
        self._owned |= set(partitions)
        self.stats.assigned = sorted({p for _, p in self._owned})
        log.info("status partitions assigned", extra={"partitions": self.stats.assigned})

    def _on_revoke(self, consumer: GroupConsumer, partitions: list[tuple[str, int]]) -> None:
        self._flush(consumer)
        self._owned -= set(partitions)
        self.stats.assigned = sorted({p for _, p in self._owned})

    def _on_lost(self, consumer: GroupConsumer, partitions: list[tuple[str, int]]) -> None:
        lost = set(partitions)
        self._flush(consumer, lost=lost)
        self._owned -= lost
        self.stats.assigned = sorted({p for _, p in self._owned})
