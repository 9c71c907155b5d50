"""The scheduler engine's transaction: what one carries, how it commits, what an abort undoes
and what a fatal error resets.

The loop (:mod:`jobwheel.streams.engine`) encodes everything an iteration causes into the open
transaction (:meth:`Committer._emit`, :meth:`Committer._dead_letter`). :meth:`Committer._commit`
produces it with one changelog record per changed job and the consumed offsets of every ready
partition (each with a progress note), commits it, then writes each partition's buffered changes
to the local RocksDB with the new changelog checkpoint. A partition that leaves before its work
committed forgets that work (:meth:`Committer._drop_pending`): its next owner reads the same
input from the committed offsets and decides the same things again.

If the transaction aborts, the buffers are discarded and the inputs are rewound to the last
commit, so the batch is processed again from committed state (run ids and event ids are
deterministic, and the aborted outputs are never visible to ``read_committed`` readers). If the
producer is fenced or hits a fatal error, every partition's uncommitted work is dropped, the
producer replaced and the partitions claimed again (restored; the group membership is kept).
A process that was fenced out of the group (a SIGSTOPped owner that wakes up) cannot commit:
the transaction's offset commit carries its stale group generation and the broker refuses it.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from jobwheel.errors import BrokerError, DeliveryError, FencedError
from jobwheel.schemas.models import StatusBatch
from jobwheel.schemas.progress import Progress
from jobwheel.schemas.topics import (
    DEAD_RUN_KIND,
    ERROR_HEADER,
    KIND_HEADER,
    RUN_HEADER,
    SIZE_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
    run_header,
)
from jobwheel.streams.core import EngineCore, _cut, _start, log
from jobwheel.streams.kafka import Record
from jobwheel.streams.processor import Output
from jobwheel.streams.state.partition import EPOCH_KEY
from jobwheel.streams.tasks import _EPOCH, PartitionTask, Phase

#: A dead-letter copy of a record larger than this carries a reference instead of the bytes.
MAX_DEAD_LETTER_VALUE = 512 * 1024

#: A status batch takes events until they fill this many bytes (a quarter of the 1 MiB a
#: broker takes by default), so a batch is never refused where its events alone would not be.
MAX_STATUS_BATCH_BYTES = 256 * 1024


class _Out(NamedTuple):
    """One record of the transaction being built (a tuple: several per job)."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


class Committer(EngineCore):
    """The transaction: its records, its commit, its abort, the reset (see the module doc)."""

    # --- the open transaction ---------------------------------------------------------------

    def _commit_pending(self) -> None:
        out, touched, since = self._out, self._touched, self._txn_since
        self._out, self._touched, self._txn_since = [], set(), None
        self._txn_backlog = False
        if out or touched:
            self._commit(out, touched, 0.0 if since is None else time.monotonic() - since)

    def _drop_pending(self, partitions: list[int]) -> None:
        """Partitions leave before the transaction carrying their work committed: forget that
        work (their new owner reads the same input again from the committed offsets)."""
        gone = set(partitions)
        if gone & self._touched:
            self._out = [r for r in self._out if r.partition not in gone]
            self._touched -= gone
            self.meters.discard(gone)

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

    def _commit(self, out: list[_Out], touched: set[int], open_s: float) -> None:
        """Produce the transaction's records and commit it, then write its state changes.
        ``open_s``: how long its work waited for this commit, from the poll that began it
        (with each part of the commit, the metrics' transaction phases: where a due run
        waits before a worker can see it)."""
        assert self.producer is not None and self.input is not None
        producer = self.producer
        now = self.clock.now_ms()
        began = time.perf_counter()
        try:
            producer.begin()
            for record in self._batched(out):
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
            produced = time.perf_counter()
            offsets_s, end_s = producer.commit(self._offsets(now), self.input.group_metadata())
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
        written = time.perf_counter()
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
        self.meters.phases(
            open_s, produced - began, offsets_s, end_s, time.perf_counter() - written
        )

    def _batched(self, out: list[_Out]) -> list[_Out]:
        """``out`` with each partition's status events carried by StatusBatch records (README
        "Status batches"): a one-off job's three events then cost the status topic a
        fraction of a record instead of three, and the sink decodes them in one pass. A
        partition with one event keeps its record of one, keyed by the job id."""
        status = self.topics.status
        events: dict[int, list[_Out]] = {}
        kept: list[_Out] = []
        for record in out:
            if record.topic == status:
                events.setdefault(record.partition, []).append(record)
            else:
                kept.append(record)
        limit = min(MAX_STATUS_BATCH_BYTES, self._record_limit)
        encode = self.codec.encode

        def carry(chunk: list[_Out]) -> None:
            if len(chunk) == 1:
                kept.append(chunk[0])
            else:
                batch = StatusBatch(tuple(r.value or b"" for r in chunk))
                kept.append(_Out(status, chunk[0].partition, None, encode(batch)))

        for records in events.values():
            chunk: list[_Out] = []
            size = 0
            for record in records:
                n = len(record.value or b"")
                if chunk and size + n > limit:
                    carry(chunk)
                    chunk, size = [], 0
                chunk.append(record)
                size += n
            carry(chunk)
        return kept

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
            # What is read again was appended before the abort: old news once more.
            task.requests_live_from = task.acks_live_from = None
            task.acks_seen_ms = task.acks_seen_committed_ms  # the rewound acks are unread again
            task.reached_ms = task.reached_committed_ms
            task.queue_seen = dict(task.queue_seen_committed)
            task.queue_reached = dict(task.queue_reached_committed)

    # --- fatal errors -----------------------------------------------------------------------

    def _reset(self, reason: str, *, rejoin: bool = False) -> None:
        """The producer is fenced or hit a fatal error: drop every partition's uncommitted
        work, replace the producer and claim the partitions again, as a new ownership restored
        from the changelog and the group's committed offsets (what the broker holds of the
        last transaction, whichever way it ended). With ``rejoin`` (the consumer's own error
        is fatal) every client is replaced and the group joined again.

        The group membership is kept otherwise. The common reset is a producer that timed out
        during a broker outage, and a consumer closed then cannot tell the broker it leaves:
        its member kept the partitions for a session timeout after the broker was back, the
        new member got none meanwhile, and their timers stayed unfired (seen for over 30 s
        with three short outages in a row). A producer that is not this process's own any
        more (a stale owner) stays fenced the same way: its group generation is refused at
        the next commit, and the consumer learns of the lost partitions at its next poll."""
        self.stats.resets += 1
        owned = list(self.owned())
        log.error(
            "dropping all partitions' uncommitted work and claiming them again",
            extra={"reason": reason, "partitions": owned, "rejoin": rejoin},
        )
        self._out, self._touched, self._txn_since = [], set(), None
        self._txn_backlog = False
        self.meters.discard()
        # Each owned task's uncommitted changes are discarded where it is closed: by
        # _disconnect (rejoin) or _claim_again; a standby copy has none.
        if rejoin:
            self._disconnect()
            if not self._stop.is_set():
                self._connect()
            return
        if self.producer is not None:
            self.producer.close()
        self.producer = None
        self._claim_again(owned)
        self.producer = self._registered_producer()


def _fields(record: _Out) -> tuple[str, int, bytes | None, bytes | None, list | None]:
    return record.topic, record.partition, record.key, record.value, record.headers
