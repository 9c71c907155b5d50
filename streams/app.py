"""faust glue: records in, processor calls, fenced dispatch out. No scheduling rules live here.

One agent consumes the requests, acks and ticks topics. They are co-partitioned (same count,
same key), so faust's assignor gives partition ``p`` of all three to one instance, and every
table write made while handling a record of partition ``p`` lands in changelog partition ``p``.

Punctuation is wall-clock and on demand: a background task on each instance looks at the first
key of each owned partition's wheel (a RocksDB seek) every ``JOBWHEEL_TICK_INTERVAL_MS`` and,
when something is due (or output is waiting), sends one tick record to that partition of the
ticks topic. The agent handles the tick inside the stream, where table writes are legal, so the
punctuation runs in order with the partition's commands and acknowledgements. Ticks queue behind
a backlog, so lag shows up as lateness: the benchmark under ``load/`` measures it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import faust

from jobwheel.clock import Clock, SystemClock
from jobwheel.errors import BrokerError, FencedError, JobwheelError, SchemaDecodeError
from jobwheel.settings import Settings
from schemas.codec import Codec
from schemas.models import JobCommand, StatusEvent
from schemas.partitioning import key_for, partition_for
from schemas.topics import JOBS_TABLE, STATE_HEADER, WHEEL_TABLE
from streams.dispatch import Dispatcher, OutRecord, TransactionalDispatcher
from streams.processor import Output, SchedulerProcessor
from streams.state.buffer import BufferedKeyValueStore, BufferedWheelStore
from streams.state.rocksdb import RocksDBLimits
from streams.state.tables import TableKeyValueStore, TableWheelStore
from streams.wheel import TimingWheel

log = logging.getLogger(__name__)

SOURCE_HEADER = "jobwheel.source"
SCHEDULER_SOURCE = b"scheduler"
EPOCH_KEY = b"\x00epoch"
TICK_RESEND_MS = 1000
STATS_INTERVAL_MS = 10_000
RECORD_ATTEMPTS = 3


@dataclass
class PartitionOwner:
    """This instance's hold on one partition: its stores, processor and unsent output."""

    partition: int
    jobs: BufferedKeyValueStore
    wheel_store: BufferedWheelStore
    wheel: TimingWheel
    processor: SchedulerProcessor
    outbox: list[OutRecord] = field(default_factory=list)
    fenced: bool = False

    def commit(self) -> None:
        self.jobs.commit()
        self.wheel_store.commit()

    def discard(self) -> None:
        self.jobs.discard()
        self.wheel_store.discard()
        # The ticker may have looked at the wheel while the deletes were pending and moved the
        # wheel's floor past entries that are now back.
        self.wheel.reset_floor()


class SchedulerRuntime:
    def __init__(
        self,
        settings: Settings,
        app: faust.App,
        dispatcher: Dispatcher,
        codec: Codec | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.app = app
        self.dispatcher = dispatcher
        self.codec = codec or Codec(settings.schema_registry_url)
        self.clock = clock or SystemClock()
        limits = RocksDBLimits(block_cache_bytes=settings.rocksdb_block_cache_bytes)
        table_kw: dict[str, Any] = {
            "key_type": bytes,
            "value_type": bytes,
            "partitions": settings.partitions,
            "options": limits.faust_options(),
        }
        self.jobs_table = app.Table(JOBS_TABLE, help="job id -> job state", **table_kw)
        self.wheel_table = app.Table(WHEEL_TABLE, help="due time + tag -> entry", **table_kw)
        self.ticks_topic = app.topic(
            self.topics.ticks, key_type=bytes, value_type=bytes, value_serializer="raw"
        )
        self.owners: dict[int, PartitionOwner] = {}
        self.tick_sent: dict[int, int] = {}
        self.stats = dict.fromkeys(
            (
                "fired",
                "commands",
                "acks",
                "rejected",
                "fenced",
                "ticks",
                "tick_delay_max_ms",
                "tick_delay_sum_ms",
                "decide_ms",
                "dispatch_ms",
                "state_ms",
            ),
            0,
        )

    # --- ownership ----------------------------------------------------------------------

    async def owner(self, partition: int) -> PartitionOwner:
        """The owner for ``partition``, claiming it (epoch + 1, fence the old owner) the first
        time this instance sees a record of it in the current assignment."""
        owner = self.owners.get(partition)
        if owner is not None:
            return owner
        jobs = BufferedKeyValueStore(TableKeyValueStore(self.jobs_table, partition))
        wheel_store = BufferedWheelStore(TableWheelStore(self.wheel_table, partition))
        raw = jobs.inner.get(EPOCH_KEY)
        epoch = (struct.unpack(">q", raw)[0] if raw else 0) + 1
        await self.dispatcher.claim(partition)
        jobs.inner.put(EPOCH_KEY, struct.pack(">q", epoch))
        wheel = TimingWheel(wheel_store)
        processor = SchedulerProcessor(
            partition,
            jobs,
            wheel,
            fencing_token=epoch,
            retention_ms=self.settings.job_retention_ms,
        )
        owner = PartitionOwner(partition, jobs, wheel_store, wheel, processor)
        self.owners[partition] = owner
        log.info(
            "partition claimed",
            extra={"partition": partition, "fencing_token": epoch, "next_due": wheel.next_due_ms()},
        )
        return owner

    async def on_revoked(self, partitions: set[int]) -> None:
        for p in partitions:
            owner = self.owners.pop(p, None)
            self.tick_sent.pop(p, None)
            if owner is None:
                continue
            if owner.outbox and not owner.fenced:
                try:
                    await self.dispatcher.send(p, owner.outbox)
                except JobwheelError:
                    log.warning("unsent status events dropped on revoke", extra={"partition": p})
            await self.dispatcher.release(p)
            log.info("partition released", extra={"partition": p})

    # --- records ------------------------------------------------------------------------

    async def handle(self, message: Any) -> None:
        """One record of requests/acks/ticks, inside the stream (table writes are legal)."""
        p = message.partition
        try:
            owner = await self.owner(p)
        except FencedError:
            log.warning("could not claim partition: fenced", extra={"partition": p})
            return
        if owner.fenced:
            return
        for attempt in range(1, RECORD_ATTEMPTS + 1):
            try:
                await self._apply(owner, message)
                return
            except Exception as exc:  # one bad record must not stop the partition
                owner.discard()
                if attempt < RECORD_ATTEMPTS:
                    # Maybe transient (metadata not yet refreshed, a broker hiccup): again.
                    log.warning(
                        "record failed; retrying",
                        extra={
                            "topic": message.topic,
                            "partition": p,
                            "offset": message.offset,
                            "attempt": attempt,
                            "error": repr(exc),
                        },
                    )
                    await asyncio.sleep(0.25 * 2**attempt)
                    continue
                log.exception(
                    "record failed; skipped",
                    extra={"topic": message.topic, "partition": p, "offset": message.offset},
                )
                if message.topic == self.topics.requests:
                    # Not lost: the command goes to the dead-letter topic with the error.
                    key = (message.key or b"").decode("utf-8", "replace")
                    with contextlib.suppress(Exception):
                        now = self.clock.now_ms()
                        self._reject(owner, message, f"scheduler error: {exc!r}", key, now)

    async def _apply(self, owner: PartitionOwner, message: Any) -> None:
        now = self.clock.now_ms()
        topic = message.topic
        if topic == self.topics.ticks:
            if message.value and len(message.value) == 8:
                delay = now - struct.unpack(">q", message.value)[0]
                self.stats["ticks"] += 1
                self.stats["tick_delay_max_ms"] = max(self.stats["tick_delay_max_ms"], delay)
                self.stats["tick_delay_sum_ms"] += delay
            await self.punctuate(owner, now)
        elif topic == self.topics.requests:
            self.on_request(owner, message, now)
        elif topic == self.topics.acks:
            self.on_ack(owner, message, now)

    def _reject(
        self, owner: PartitionOwner, message: Any, reason: str, job_id: str, now: int
    ) -> None:
        self.stats["rejected"] += 1
        event_id = f"{message.topic}:{message.partition}:{message.offset}:REJECTED"
        out = owner.processor.reject(job_id, reason, now, event_id)
        owner.commit()
        self._queue(owner, out)
        headers = [
            ("jobwheel.error", reason.encode()),
            ("jobwheel.source.topic", message.topic.encode()),
            ("jobwheel.source.partition", str(message.partition).encode()),
            ("jobwheel.source.offset", str(message.offset).encode()),
        ]
        owner.outbox.append(OutRecord(self.topics.dead_letter, message.key, message.value, headers))
        log.warning(
            "request rejected",
            extra={"partition": message.partition, "offset": message.offset, "reason": reason},
        )

    def on_request(self, owner: PartitionOwner, message: Any, now: int) -> None:
        key = message.key or b""
        job_id = key.decode("utf-8", "replace")
        try:
            cmd = self.codec.decode(message.value or b"")
        except SchemaDecodeError as exc:
            self._reject(owner, message, f"undecodable record: {exc}", job_id, now)
            return
        if not isinstance(cmd, JobCommand):
            self._reject(owner, message, f"a {type(cmd).__name__} is not a JobCommand", job_id, now)
            return
        expected = partition_for(cmd.job_id, self.settings.partitions)
        if expected != owner.partition:
            self._reject(
                owner,
                message,
                f"job {cmd.job_id!r} belongs to partition {expected}, not {owner.partition}: "
                "key the record with the raw UTF-8 job id and use the murmur2 partitioner",
                cmd.job_id,
                now,
            )
            return
        self.stats["commands"] += 1
        out = owner.processor.on_command(cmd, now)
        owner.commit()
        self._queue(owner, out)

    def on_ack(self, owner: PartitionOwner, message: Any, now: int) -> None:
        for name, value in message.headers or ():
            if name == STATE_HEADER and value == b"STARTED":
                return  # changes nothing the scheduler decides on: not even decoded
        try:
            ev = self.codec.decode(message.value or b"")
        except SchemaDecodeError:
            log.warning("undecodable status record ignored", extra={"offset": message.offset})
            return
        if not isinstance(ev, StatusEvent) or ev.source != "worker":
            return
        self.stats["acks"] += 1
        out = owner.processor.on_ack(ev, now)
        owner.commit()
        self._queue(owner, out)

    async def punctuate(self, owner: PartitionOwner, now: int) -> None:
        p = owner.partition
        t0 = time.perf_counter()
        out, due = owner.processor.punctuate(now, self.settings.dispatch_batch_limit)
        records = [*owner.outbox, *self._encode(out)]
        t1 = time.perf_counter()
        self.stats["decide_ms"] += int((t1 - t0) * 1000)
        if records:
            try:
                await self.dispatcher.send(p, records)
                self.stats["dispatch_ms"] += int((time.perf_counter() - t1) * 1000)
            except FencedError:
                owner.discard()
                owner.fenced = True
                self.stats["fenced"] += 1
                log.error(
                    "fenced: another scheduler owns this partition now", extra={"partition": p}
                )
                return
            except BrokerError:
                owner.discard()
                log.exception(
                    "dispatch failed; will retry on the next tick", extra={"partition": p}
                )
                self.tick_sent.pop(p, None)
                return
        owner.outbox.clear()
        t2 = time.perf_counter()
        owner.commit()
        self.stats["state_ms"] += int((time.perf_counter() - t2) * 1000)
        self.stats["fired"] += len(out.runs)
        self.tick_sent.pop(p, None)

    # --- output -------------------------------------------------------------------------

    def _queue(self, owner: PartitionOwner, out: Output) -> None:
        if out:
            owner.outbox.extend(self._encode(out))

    def _encode(self, out: Output) -> list[OutRecord]:
        t = self.topics
        enc = self.codec.encode
        records = [OutRecord(t.runs, key_for(r.job_id), enc(r)) for r in out.runs]
        src = [(SOURCE_HEADER, SCHEDULER_SOURCE)]
        records += [OutRecord(t.status, key_for(e.job_id), enc(e), src) for e in out.status]
        records += [
            OutRecord(
                t.dead_letter,
                key_for(run.job_id),
                enc(run),
                [("jobwheel.error", reason.encode()), ("jobwheel.kind", b"dead-run")],
            )
            for run, reason in out.dead_runs
        ]
        return records

    # --- punctuation trigger ------------------------------------------------------------

    def owned_partitions(self) -> set[int]:
        return {
            tp.partition
            for tp in self.app.assignor.assigned_actives()
            if tp.topic == self.topics.requests
        }

    def needs_tick(self, p: int, now: int) -> bool:
        sent = self.tick_sent.get(p)
        if sent is not None and now - sent < TICK_RESEND_MS:
            return False
        owner = self.owners.get(p)
        if owner is None:
            return True  # the first tick claims the partition
        if owner.fenced:
            return False
        if owner.outbox:
            return True
        nxt = owner.wheel.next_due_ms()
        return nxt is not None and nxt <= now

    def report(self) -> None:
        """One structured log line of counters since the last report (then reset)."""
        s = self.stats
        ticks = s["ticks"]
        log.info(
            "scheduler stats",
            extra={
                **{k: v for k, v in s.items() if not k.startswith("tick_delay")},
                "tick_delay_avg_ms": round(s["tick_delay_sum_ms"] / ticks, 1) if ticks else None,
                "tick_delay_max_ms": s["tick_delay_max_ms"],
                "owned": sorted(self.owners),
            },
        )
        for k in s:
            s[k] = 0

    async def ticker(self) -> None:
        interval = self.settings.tick_interval_ms / 1000
        last_report = self.clock.now_ms()
        while True:
            await asyncio.sleep(interval)
            if self.clock.now_ms() - last_report >= STATS_INTERVAL_MS:
                last_report = self.clock.now_ms()
                self.report()
            if self.app.rebalancing or not self.app.tables.actives_ready:
                continue
            try:
                now = self.clock.now_ms()
                for p in self.owned_partitions():
                    if self.needs_tick(p, now):
                        self.tick_sent[p] = now
                        await self.ticks_topic.send(
                            key=None, value=struct.pack(">q", now), partition=p
                        )
            except Exception:
                log.exception("ticker iteration failed")


def build_app(
    settings: Settings, dispatcher: Dispatcher | None = None
) -> tuple[faust.App, SchedulerRuntime]:
    servers = [f"kafka://{s.strip()}" for s in settings.bootstrap_servers.split(",") if s.strip()]
    conf: dict[str, Any] = {
        "broker": servers,
        "store": "rocksdb://",
        "datadir": str((settings.data_dir / "scheduler").resolve()),
        "topic_partitions": settings.partitions,
        "topic_replication_factor": settings.replication_factor,
        "table_standby_replicas": 0,
        "web_enabled": False,
        "key_serializer": "raw",
        "value_serializer": "raw",
        "consumer_auto_offset_reset": "earliest",
        "broker_commit_interval": 1.0,
        # faust's producer carries the changelog writes (several per fire) and the ticks: with
        # no linger every record was its own produce request (~250 us of syscalls each here);
        # 5 ms batches them (+25 % commands/s, fire capacity 1.8k -> 3.3k/s on one core).
        "producer_linger": 0.005,
        "topic_allow_declare": True,
        # A dead instance's partitions move after the session timeout: 10 s, not faust's 60 s.
        "broker_session_timeout": 10.0,
        "broker_heartbeat_interval": 3.0,
        "broker_rebalance_timeout": 20.0,
        # Ticks wait behind whatever is already buffered in the stream: keep the buffer short
        # so a burst of commands cannot delay punctuation by seconds.
        "stream_buffer_maxsize": 256,
        "broker_max_poll_records": 256,
    }
    conf.update(settings.faust_config)
    app = faust.App(settings.scheduler_app_id, **conf)
    runtime = SchedulerRuntime(settings, app, dispatcher or TransactionalDispatcher(settings))
    t = settings.topics
    source = app.topic(
        t.requests, t.acks, t.ticks, key_type=bytes, value_type=bytes, value_serializer="raw"
    )

    @app.agent(source, name="scheduler")
    async def scheduler(stream: faust.StreamT) -> None:
        async for event in stream.events():
            await runtime.handle(event.message)

    @app.task
    async def ticker() -> None:
        await runtime.ticker()

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: set[Any], **_: Any) -> None:
        await runtime.on_revoked({tp.partition for tp in revoked if tp.topic == t.requests})

    @app.on_rebalance_complete.connect
    async def on_rebalance_complete(sender: Any, **_: Any) -> None:
        log.info("rebalance complete", extra={"owned": sorted(runtime.owned_partitions())})

    return app, runtime


def run_scheduler(settings: Settings) -> int:
    """Run one scheduler instance until SIGTERM/SIGINT (the faust worker handles signals)."""
    from deploy.topics import ensure_topics

    # The changelogs must exist with the right partition count before faust writes to them: a
    # changelog faust creates on the fly is briefly known with 0 partitions, and faust then
    # refuses every table write (PartitionsMismatch) until its metadata refreshes.
    ensure_topics(settings)
    (settings.data_dir / "scheduler").mkdir(parents=True, exist_ok=True)
    app, runtime = build_app(settings)
    worker = faust.Worker(
        app, loglevel=settings.log_level.lower(), quiet=True, override_logging=False
    )
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
