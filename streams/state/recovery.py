"""Restoring a partition's state from its changelog (Kafka Streams' ``StoreChangelogReader``).

The changelog is the truth; the local database is a cache of it with a checkpoint (the next
changelog offset it has not applied). On claim the engine reads the changelog partition from the
checkpoint to its end, the high watermark (``read_committed``: aborted transactions are skipped,
and the read waits for the ones still undecided) and hands the records here in batches. Each
batch is applied in one atomic write together with the new checkpoint, so a restore interrupted
by a crash resumes where it stopped.

The wheels are an index of the records' timers, which come from each record's header
(``jobstate.peek_timers``), so a million records are indexed without parsing a million JSON
documents. Catching up a tail re-indexes each record as it is applied (its old timers out, its
new ones in). A restore from scratch (a new owner with an empty disk: the failover case) is
faster in two passes: the records alone, last one per key winning as RocksDB writes them, then
one scan that indexes what is left (:func:`rebuild_index`); an ``index pending`` mark in the
database says a crash interrupted it, and the next claim starts over.

The checkpoint is trusted only when it fits the changelog: a checkpoint below the changelog's
first offset or beyond its high watermark (the topic was recreated, records were deleted) means
the local state cannot be brought up to date, and it is wiped and rebuilt from the start. (Past
the last stable offset is no such sign: the owner's last transaction may be committed and its
marker not written yet.) Nor is a checkpoint older than :data:`MAX_CHECKPOINT_AGE_MS` with
records after it: compaction may have dropped deletions it would miss. A state can be that old
on a disk left alone (a scheduler stopped for days) and, since the database writes no log of its
own (:mod:`jobwheel.streams.state.rocksdb`), in a killed process that had written little since
its memtables were last flushed.

Pure of Kafka: the engine reads the topic; this module only applies what it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from jobwheel.schemas.topics import CHANGELOG_DELETE_RETENTION_MS
from jobwheel.streams.jobstate import DEADLINES, TIMERS, peek_timers
from jobwheel.streams.state.partition import WHEEL_VALUE, StateBackend, WheelChanges, index_changes
from jobwheel.streams.wheel import entry_key

log = logging.getLogger(__name__)

#: ``(offset, key, value)``; value None is a tombstone.
ChangelogRecord = tuple[int, bytes, bytes | None]


@dataclass
class RestorePlan:
    """Where reading the changelog starts (``start``) and must reach (``end``); ``fresh``: from
    scratch, records first and the index at the end."""

    start: int
    end: int
    wiped: bool
    fresh: bool


def plan_restore(backend: StateBackend, low: int, high: int, *, now_ms: int) -> RestorePlan:
    """Decide where to read from, given the changelog partition's first (``low``) and end
    (``high``) offsets; wipes a local state that cannot be caught up."""
    checkpoint = backend.checkpoint()
    pending = backend.index_pending()
    if checkpoint is not None and low <= checkpoint <= high and not pending:
        written = backend.checkpoint_written_ms()
        age_ms = None if written is None else now_ms - written
        if checkpoint == high or (age_ms is not None and age_ms <= MAX_CHECKPOINT_AGE_MS):
            return RestorePlan(checkpoint, high, wiped=False, fresh=False)
        log.warning(
            "local state is older than the changelog keeps deletions; rebuilding it from the "
            "changelog",
            extra={
                "checkpoint": checkpoint,
                "checkpoint_age_ms": age_ms,  # None: written by a release that kept no time
                "max_age_ms": MAX_CHECKPOINT_AGE_MS,
                "changelog_end": high,
            },
        )
    elif checkpoint is not None:
        log.warning(
            "local state does not fit the changelog; rebuilding it from the changelog",
            extra={
                "checkpoint": checkpoint,
                "changelog_start": low,
                "changelog_end": high,
                "interrupted_restore": pending,
            },
        )
    backend.wipe()
    backend.set_index_pending(True)
    return RestorePlan(low, high, wiped=checkpoint is not None, fresh=True)


_NO_WHEELS: WheelChanges = {TIMERS: {}, DEADLINES: {}}

#: The oldest checkpoint caught up from rather than rebuilt from scratch. Compaction drops a
#: deleted job's older records at once and its tombstone CHANGELOG_DELETE_RETENTION_MS later:
#: a local state older than that could read neither, keep the job as it once was, and fire a
#: job that finished and was forgotten long ago. Half of it leaves a margin for clocks.
MAX_CHECKPOINT_AGE_MS = CHANGELOG_DELETE_RETENTION_MS // 2


def apply_batch(
    backend: StateBackend, records: Sequence[ChangelogRecord], end: int, *, fresh: bool = False
) -> int:
    """Apply changelog records in order and set the checkpoint to ``end`` (the offset after the
    batch, markers included); re-index each record unless restoring ``fresh`` (then
    :func:`rebuild_index` does it at the end). Returns how many were applied."""
    if fresh:
        backend.write({key: value for _offset, key, value in records}, _NO_WHEELS, end)
        return len(records)
    jobs: dict[bytes, bytes | None] = {}
    wheels: WheelChanges = {TIMERS: {}, DEADLINES: {}}
    get = backend.jobs.get
    for _offset, key, value in records:
        old = jobs[key] if key in jobs else get(key)
        index_changes(key, old, value, wheels)
        jobs[key] = value
    backend.write(jobs, wheels, end)
    return len(records)


def rebuild_index(backend: StateBackend, batch: int = 50_000) -> int:
    """Index every stored record's timers (after a fresh restore); returns the entries made."""
    wheels: WheelChanges = {TIMERS: {}, DEADLINES: {}}
    made = pending = 0
    for key, value in backend.job_items():
        for wheel, due, tag in peek_timers(value):
            wheels[wheel][entry_key(due, key, tag)] = WHEEL_VALUE
            pending += 1
        if pending >= batch:
            backend.write({}, wheels, None)
            made += pending
            wheels, pending = {TIMERS: {}, DEADLINES: {}}, 0
    backend.write({}, wheels, None)
    backend.set_index_pending(False)
    return made + pending
