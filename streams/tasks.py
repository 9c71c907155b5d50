"""The partitions one scheduler process holds (Kafka Streams' TaskManager): which of them it
owns, which it keeps as warm copies, and every transition between the two.

Each held partition is a task: a :class:`PartitionTask` (this process's ownership: restoring,
then ready) or a :class:`StandbyTask` (a warm copy). A task object is made anew whenever a
partition moves between the two; only the local state and its restore progress pass from one to
the next. Each transition has one place:

- **assign** (:meth:`TaskManager._on_assign`): a claim, a new :class:`PartitionTask` on the
  partition's local state, a standby copy's or opened for it (:meth:`PartitionTask.claim`);
- **revoke** and **lose** (:meth:`TaskManager._on_revoke`, :meth:`TaskManager._on_lost`): the
  partition's uncommitted work is forgotten and the task given up
  (:meth:`TaskManager._close_task`): kept as a standby copy (:meth:`PartitionTask.standby`), or
  closed with its local state;
- **standby** (:meth:`TaskManager._standby_all`): a copy of every partition not held.

Restoring a claimed partition and making it ready is :mod:`jobwheel.streams.restore`'s.

**Standby replicas** (``JOBWHEEL_SCHEDULER_STANDBY``, on by default; Kafka Streams'
``num.standby.replicas``): every partition this process does not own is kept as a warm copy,
read from the changelog between iterations. When such a partition is assigned here (its owner
died, or a rebalance moved it) only the changelog's tail is left to read: a failover costs the
session timeout, not a restore of the whole partition. The price is reading every other
process's changelog too.
"""

from __future__ import annotations

import enum
import logging
import struct
import time
from dataclasses import dataclass, field

from jobwheel.schemas.progress import Progress
from jobwheel.streams.core import EngineCore, log
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import PartitionState, RocksDBBackend

#: The ownership epoch as the changelog keeps it (under ``EPOCH_KEY``).
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
    # The end offset of each input when this ownership had read all of it: a record from
    # there on was appended while the ownership waited for it, so one read at the end says
    # the broker's "now" (SchedulerEngine._observe_broker_time). None: not read to its end yet.
    requests_live_from: int | None = None
    acks_live_from: int | None = None
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
    # The input consumer's position is not the committed offset (a claim without a
    # rebalance, after a reset): seek it there once restored.
    rewind_input: bool = False
    # The group's committed offsets were read for this claim (before the changelog's end is
    # measured: see SchedulerEngine._start_restore).
    offsets_read: bool = False
    # Since when (monotonic) this claim has failed to read its committed offsets or to rewind
    # its input, counting only while Kafka accepts connections (Restorer._claim_failed).
    claim_failing_since: float | None = None
    # When (monotonic) this claim last asked for its committed offsets: the claims that waited
    # longest ask first (Restorer._restore).
    offsets_asked_at: float = 0.0
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


class TaskManager(EngineCore):
    """The partitions held and their transitions (see the module doc)."""

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

    def _claim_again(self, partitions: list[int]) -> None:
        """After a reset (:meth:`~jobwheel.streams.commit.Committer._reset`): the partitions
        stay assigned to this member, but their ownership starts over, as after a rebalance
        that gave them back: a new task each, restored from the changelog, inputs paused
        until then and read again from the group's committed offsets (the consumer's
        position is past work that never committed)."""
        assert self.input is not None
        self._close_tasks(partitions, "reset")
        for p in partitions:
            self.input.pause(p)
            task = self.tasks.get(p) or self._open_standby(p)
            assert not isinstance(task, PartitionTask)
            self.tasks[p] = claimed = PartitionTask.claim(task)
            claimed.rewind_input = True

    def _open_standby(self, partition: int) -> StandbyTask:
        """Open a partition's local state, not owned (yet)."""
        backend = RocksDBBackend(self.directory.partition(partition), self.resources, self.clock)
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
