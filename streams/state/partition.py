"""One partition's scheduler state: the ``jobs`` store, the timing wheels derived from it, and
the changes of the transaction in progress.

What is stored where (one RocksDB database per owned partition, a column family each):

- ``default``: job id -> encoded job record (:mod:`jobwheel.streams.jobstate`), plus the partition's
  ownership epoch under :data:`EPOCH_KEY`. This is the state store; every change to it is also a
  record on the compacted changelog topic, in the same transaction as the outputs it caused.
- ``timers`` and ``deadlines``: the timing wheels, an index of the instants each record waits for
  (``jobstate.timers_of``). Derived from the records on every write (:meth:`PartitionState.put`
  diffs the old and new record's timers), never changelogged, rebuilt by the restore.
- ``meta``: the changelog offset the database has applied up to (the checkpoint), written in the
  same atomic batch as the state it describes, so a restart on the same disk replays only the
  changelog's tail.

The processor reads and writes through a :class:`PartitionState`; the engine commits or discards
its buffered changes when the Kafka transaction commits or aborts.
"""

from __future__ import annotations

import shutil
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import rocksdict

from jobwheel.clock import Clock, SystemClock
from jobwheel.errors import RecordTooLargeError
from jobwheel.streams.jobstate import (
    DEADLINES,
    TIMERS,
    JobRecord,
    Timers,
    decode_job,
    encode_job,
    peek_timers,
    timer_entries,
)
from jobwheel.streams.state.base import KeyValueStore, WheelStore
from jobwheel.streams.state.buffer import BufferedKeyValueStore, BufferedWheelStore
from jobwheel.streams.state.cache import RecordCache
from jobwheel.streams.state.memory import MemoryKeyValueStore, MemoryWheelStore
from jobwheel.streams.state.rocksdb import RocksDBKeyValueStore, RocksDBResources, RocksDBWheelStore
from jobwheel.streams.wheel import TimingWheel, entry_key
from jobwheel.streams.wheel.entry import encode_value

#: Not a job id (job ids cannot contain NUL): the partition's ownership epoch, changelogged.
EPOCH_KEY = b"\x00epoch"
WHEEL_VALUE = encode_value(b"")
_CHECKPOINT = b"changelog.checkpoint"
_INDEX_PENDING = b"index.pending"
_OFFSET = struct.Struct(">q")
#: The checkpoint's value since the state writes no log: the offset and the wall-clock
#: milliseconds it was written at (a value of ``_OFFSET`` alone: written before, time unknown).
_STAMPED = struct.Struct(">qq")

#: ``{wheel: {key: value or None}}``: changes to the two wheels, as a batch.
WheelChanges = dict[int, dict[bytes, bytes | None]]
#: In the timers of the stored records: the key has no record.
_NO_RECORD: Timers = []
#: A :meth:`PartitionState.savepoint` of a key the open transaction had not written.
_UNWRITTEN = object()


def index_changes(job_key: bytes, old: bytes | None, new: bytes | None, out: WheelChanges) -> None:
    """Add to ``out`` the wheel entries to delete (None) and to put for a record that changes
    from ``old`` to ``new`` (either may be None: created, deleted)."""
    before = set(peek_timers(old))
    after = set(peek_timers(new))
    for wheel, due, tag in before - after:
        out[wheel][entry_key(due, job_key, tag)] = None
    for wheel, due, tag in after - before:
        out[wheel][entry_key(due, job_key, tag)] = WHEEL_VALUE


class StateBackend(ABC):
    """Where a partition's committed state lives: read views and one atomic write."""

    jobs: KeyValueStore
    timers: WheelStore
    deadlines: WheelStore

    @abstractmethod
    def write(
        self,
        jobs: dict[bytes, bytes | None],
        wheels: WheelChanges,
        checkpoint: int | None,
    ) -> None:
        """Apply the changes (None deletes) and the changelog checkpoint, all or nothing."""

    @abstractmethod
    def checkpoint(self) -> int | None:
        """The changelog offset the state has applied up to (next offset to read), or None."""

    @abstractmethod
    def checkpoint_written_ms(self) -> int | None:
        """When the checkpoint was written, by the clock the backend was given (None: not
        known, a checkpoint written by an older release)."""

    @abstractmethod
    def wipe(self) -> None:
        """Forget everything (the changelog is replayed from its start)."""

    @abstractmethod
    def index_pending(self) -> bool:
        """Were records restored without their wheel entries (a restore from scratch that has
        not finished)?"""

    @abstractmethod
    def set_index_pending(self, pending: bool) -> None: ...

    @abstractmethod
    def job_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every stored record, in key order."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release the store (files, locks)."""


class MemoryBackend(StateBackend):
    """The same contract in dicts, for unit tests and tools."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.jobs = MemoryKeyValueStore()
        self.timers = MemoryWheelStore()
        self.deadlines = MemoryWheelStore()
        self._clock = clock or SystemClock()
        self._checkpoint: int | None = None
        self._written_ms: int | None = None
        self._index_pending = False

    def index_pending(self) -> bool:
        return self._index_pending

    def set_index_pending(self, pending: bool) -> None:
        self._index_pending = pending

    def job_items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(sorted(self.jobs.items()))

    def write(
        self, jobs: dict[bytes, bytes | None], wheels: WheelChanges, checkpoint: int | None
    ) -> None:
        for store, changes in (
            (self.jobs, jobs),
            (self.timers, wheels[TIMERS]),
            (self.deadlines, wheels[DEADLINES]),
        ):
            for key, value in changes.items():
                if value is None:
                    store.delete(key)
                else:
                    store.put(key, value)
        if checkpoint is not None:
            self._checkpoint = checkpoint
            self._written_ms = self._clock.now_ms()

    def checkpoint(self) -> int | None:
        return self._checkpoint

    def checkpoint_written_ms(self) -> int | None:
        return self._written_ms

    def wipe(self) -> None:
        for store in (self.jobs, self.timers, self.deadlines):
            store.clear()
        self._checkpoint = self._written_ms = None
        self._index_pending = False


class RocksDBBackend(StateBackend):
    """One database per partition with the column families described in the module doc.

    Opening it takes RocksDB's lock on the directory, so two processes can never work on the
    same partition state at once.
    """

    FAMILIES = ("timers", "deadlines", "meta")

    def __init__(self, path: Path, resources: RocksDBResources, clock: Clock | None = None) -> None:
        self.path = path
        self.resources = resources
        self._clock = clock or SystemClock()
        self._open()
        self.jobs = RocksDBKeyValueStore(self.db)
        self.timers = RocksDBWheelStore(self._cf["timers"])
        self.deadlines = RocksDBWheelStore(self._cf["deadlines"])

    def _open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        db = self.resources.open(self.path, self.FAMILIES)
        self.db = db
        self._cf = {name: db.get_column_family(name) for name in self.FAMILIES}
        self._handles = {name: db.get_column_family_handle(name) for name in self.FAMILIES}

    def write(
        self, jobs: dict[bytes, bytes | None], wheels: WheelChanges, checkpoint: int | None
    ) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in jobs.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        for wheel, name in ((TIMERS, "timers"), (DEADLINES, "deadlines")):
            handle = self._handles[name]
            for key, value in wheels[wheel].items():
                if value is None:
                    batch.delete(key, handle)
                else:
                    batch.put(key, value, handle)
        if checkpoint is not None:
            stamped = _STAMPED.pack(checkpoint, self._clock.now_ms())
            batch.put(_CHECKPOINT, stamped, self._handles["meta"])
        if not batch.is_empty():
            self.db.write(batch)

    def checkpoint(self) -> int | None:
        raw = self._cf["meta"].get(_CHECKPOINT)
        return None if raw is None else int(_OFFSET.unpack_from(raw)[0])

    def checkpoint_written_ms(self) -> int | None:
        raw = self._cf["meta"].get(_CHECKPOINT)
        return int(_STAMPED.unpack(raw)[1]) if raw and len(raw) == _STAMPED.size else None

    def index_pending(self) -> bool:
        return self._cf["meta"].get(_INDEX_PENDING) is not None

    def set_index_pending(self, pending: bool) -> None:
        if pending:
            self._cf["meta"].put(_INDEX_PENDING, b"1")
        else:
            self._cf["meta"].delete(_INDEX_PENDING)

    def job_items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.db.items())

    def wipe(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._open()
        # The stores handed out stay valid: they now read the new database.
        self.jobs.db = self.db
        self.timers.db = self._cf["timers"]
        self.deadlines.db = self._cf["deadlines"]

    def close(self) -> None:
        """Close the database; every column family object must be closed too, or RocksDB
        keeps the directory locked."""
        for family in self._cf.values():
            family.close()
        self._cf.clear()
        self._handles.clear()
        self.db.close()


class PartitionState:
    """A partition's state as the processor sees it: committed state plus this transaction's
    changes. Every job write re-derives the record's wheel entries, so the wheels never
    disagree with the records.

    **The record cache** (:class:`~jobwheel.streams.state.cache.RecordCache`): the records
    saved are kept decoded, those that will be read again soon, up to ``cache_size``, and
    :meth:`load_record` hands a cached record *out*: it leaves the cache, the caller owns it
    and changes it in place, and the cache has it again only once it is saved. A record loaded
    and changed but never saved is therefore read from its bytes next time, exactly as without
    the cache; the cache never holds anything but what the last save wrote. Discarding the
    transaction's changes empties it (they may be what it holds).

    Each write re-derives the record's wheel entries from the timers it had and has. The
    timers a record was saved with are kept beside it (in the cache, and for the records of
    the open transaction), so a save does not parse them back out of the old bytes."""

    def __init__(self, backend: StateBackend, cache_size: int = 4096) -> None:
        self.backend = backend
        self._records = RecordCache(cache_size)
        #: The timers of the stored record under a key, for keys handled since the last
        #: commit (a key absent here: read them from the stored bytes).
        self._timers: dict[bytes, Timers] = {}
        self._jobs = BufferedKeyValueStore(backend.jobs)
        self._wheel_stores = {
            TIMERS: BufferedWheelStore(backend.timers),
            DEADLINES: BufferedWheelStore(backend.deadlines),
        }
        #: Fires, retries and expiries: due by the wall clock.
        self.timers = TimingWheel(self._wheel_stores[TIMERS])
        #: Visibility deadlines: due once the acknowledgements before them have been read.
        self.deadlines = TimingWheel(self._wheel_stores[DEADLINES])
        self._wheels = {TIMERS: self.timers, DEADLINES: self.deadlines}

    def get(self, key: bytes) -> bytes | None:
        return self._jobs.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._records.take(key)
        self._reindex(key, self.stored_timers(key) or [], peek_timers(value))
        self._timers.pop(key, None)
        self._jobs.put(key, value)

    def delete(self, key: bytes) -> None:
        self._records.take(key)
        old = self.stored_timers(key)
        self._timers.pop(key, None)
        if old is None:
            return
        self._reindex(key, old, [])
        self._jobs.delete(key)

    def stored_timers(self, key: bytes) -> Timers | None:
        """The timers of the record stored under ``key`` (None: there is none)."""
        timers = self._timers.get(key)
        if timers is not None:
            return None if timers is _NO_RECORD else timers
        raw = self._jobs.get(key)
        return None if raw is None else peek_timers(raw)

    def load_record(self, key: bytes) -> JobRecord | None:
        """The job record under ``key``, now the caller's to change (see the class doc);
        :class:`~jobwheel.errors.StateError` when its bytes cannot be read."""
        cached = self._records.take(key)
        if cached is not None:
            job, self._timers[key] = cached
            return job
        raw = self._jobs.get(key)
        if raw is None:
            self._timers[key] = _NO_RECORD  # a new job's save need not look again
            return None
        self._timers[key] = peek_timers(raw)  # nor the save of one read from its bytes
        return decode_job(raw)

    def save_record(self, key: bytes, job: JobRecord, max_bytes: int | None = None) -> None:
        """Write ``job`` under ``key``; it stays decoded in the cache until loaded again.

        :class:`~jobwheel.errors.RecordTooLargeError` when key and record come to more than
        ``max_bytes``, before anything is written: every write here goes to the changelog in
        the same transaction, and one the changelog cannot carry would leave the local state
        ahead of every standby and of the next owner."""
        timers = timer_entries(job)
        data = encode_job(job, timers)
        if max_bytes is not None and len(key) + len(data) > max_bytes:
            raise RecordTooLargeError(
                f"job {key[:200].decode('utf-8', 'replace')!r}: its record would be "
                f"{len(key) + len(data)} bytes, over the {max_bytes} its changelog can carry "
                f"({len(job.active)} runs in flight, {len(job.spec.args_json)} characters of "
                "args)"
            )
        self._reindex(key, self.stored_timers(key) or [], timers)
        self._jobs.put(key, data)
        self._timers[key] = timers
        self._records.keep(key, job, timers)

    def savepoint(self, key: bytes) -> object:
        """What the open transaction holds for ``key`` now, for :meth:`rollback`: one change
        undone, the rest of the transaction kept (a timer whose handling failed)."""
        return self._jobs.pending.get(key, _UNWRITTEN)

    def rollback(self, key: bytes, point: object) -> None:
        """Put ``key`` back as it was at :meth:`savepoint` ``point``, its wheel entries too."""
        value = self.backend.jobs.get(key) if point is _UNWRITTEN else point
        if value is None:
            self.delete(key)
        else:
            assert isinstance(value, bytes)
            self.put(key, value)
        if point is _UNWRITTEN:  # read the committed bytes again, and write nothing
            self._jobs.pending.pop(key, None)
            self._timers.pop(key, None)

    def _reindex(self, key: bytes, before: Timers, after: Timers) -> None:
        """Move the wheel entries of ``key`` from the timers ``before`` to those ``after``."""
        wheels = self._wheels
        for timer in before:
            if timer not in after:
                wheel, due, tag = timer
                wheels[wheel].discard(entry_key(due, key, tag))
        for timer in after:
            if timer not in before:
                wheel, due, tag = timer
                wheels[wheel].insert(entry_key(due, key, tag))

    @property
    def dirty(self) -> bool:
        return bool(self._jobs.pending)

    def changes(self) -> dict[bytes, bytes | None]:
        """The uncommitted record changes: what the changelog must carry (None: tombstone)."""
        return self._jobs.pending

    def commit(self, checkpoint: int | None) -> None:
        """The transaction committed: write its changes (and how far the changelog now goes)."""
        self.backend.write(
            self._jobs.pending,
            {wheel: store.pending for wheel, store in self._wheel_stores.items()},
            checkpoint,
        )
        self._clear()

    def discard(self) -> None:
        """The transaction aborted: forget its changes."""
        self._clear()
        self._records.clear()
        # The wheels may have moved their floors past entries whose deletion is now undone.
        self.timers.reset_floor()
        self.deadlines.reset_floor()

    def _clear(self) -> None:
        self._timers.clear()
        self._jobs.discard()
        for store in self._wheel_stores.values():
            store.discard()
