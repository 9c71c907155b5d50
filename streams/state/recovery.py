"""Restoring a partition's state from its changelog (Kafka Streams' ``StoreChangelogReader``).

The changelog is the truth; the local database is a cache of it with a checkpoint (the next
changelog offset it has not applied). On claim the engine reads the changelog partition from the
checkpoint to its end (``read_committed``: aborted transactions are skipped) and hands the
records here in batches. Each batch is applied in one atomic write together with the new
checkpoint, so a restore interrupted by a crash resumes where it stopped.

The wheels are rebuilt as the records are applied: a record's timers come from its header
(``jobstate.peek_timers``), so a million records are indexed without parsing a million JSON
documents. The checkpoint is trusted only when it fits the changelog: a checkpoint below the
changelog's first offset or beyond its end (the topic was recreated, records were deleted) means
the local state cannot be brought up to date, and it is wiped and rebuilt from the start.

Pure of Kafka: the engine reads the topic; this module only applies what it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from streams.jobstate import DEADLINES, TIMERS
from streams.state.partition import StateBackend, WheelChanges, index_changes

log = logging.getLogger(__name__)

#: ``(offset, key, value)``; value None is a tombstone.
ChangelogRecord = tuple[int, bytes, bytes | None]


@dataclass
class RestorePlan:
    """Where reading the changelog starts (``start``) and must reach (``end``)."""

    start: int
    end: int
    wiped: bool


def plan_restore(backend: StateBackend, low: int, high: int) -> RestorePlan:
    """Decide where to read from, given the changelog partition's first (``low``) and end
    (``high``) offsets; wipes a local state that cannot be caught up."""
    checkpoint = backend.checkpoint()
    if checkpoint is not None and low <= checkpoint <= high:
        return RestorePlan(checkpoint, high, wiped=False)
    wiped = checkpoint is not None
    if wiped:
        log.warning(
            "local state does not fit the changelog; rebuilding it from the changelog",
            extra={"checkpoint": checkpoint, "changelog_start": low, "changelog_end": high},
        )
        backend.wipe()
    return RestorePlan(low, high, wiped=wiped)


def apply_batch(backend: StateBackend, records: Sequence[ChangelogRecord], end: int) -> int:
    """Apply changelog records in order, with their wheel entries, and set the checkpoint to
    ``end`` (the offset after the batch, markers included). Returns how many were applied."""
    jobs: dict[bytes, bytes | None] = {}
    wheels: WheelChanges = {TIMERS: {}, DEADLINES: {}}
    get = backend.jobs.get
    for _offset, key, value in records:
        old = jobs[key] if key in jobs else get(key)
        index_changes(key, old, value, wheels)
        jobs[key] = value
    backend.write(jobs, wheels, end)
    return len(records)
