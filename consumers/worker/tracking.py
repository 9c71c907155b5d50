"""Pure bookkeeping of the worker pool: commit watermarks, latest attempts, fencing tokens.

Kept free of Kafka and asyncio so the rules that decide what is committed and what is dropped as
STALE are unit-tested directly.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class OffsetTracker:
    """Which offset of one partition is safe to commit.

    Runs finish out of order (a 1 s task fetched after a 1 h one finishes first), but a committed
    offset means "everything before it is done". So the tracker keeps the fetched offsets in order
    with a done flag and commits only up to the first one still pending: the contiguous watermark.
    A crash then re-delivers every unfinished run (and possibly some finished ones: at-least-once),
    never skips one.

    Offsets arrive in increasing order per partition (Kafka guarantees it within an assignment);
    gaps (transaction markers, aborted records under ``read_committed``) are harmless because only
    fetched offsets are tracked.
    """

    __slots__ = ("partition", "revoked", "_entries", "_pending", "_watermark", "_committed")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.revoked = False
        self._entries: deque[int] = deque()  # fetched offsets, ascending, done or not
        self._pending: set[int] = set()  # fetched offsets not done yet
        self._watermark: int | None = None
        self._committed: int | None = None

    def add(self, offset: int) -> None:
        last = self._entries[-1] if self._entries else None
        if last is None and self._watermark is not None:
            last = self._watermark - 1
        if last is not None and offset <= last:
            raise ValueError(
                f"partition {self.partition}: offset {offset} after {last}; "
                "a tracker lives for one assignment, make a new one after a rebalance"
            )
        self._entries.append(offset)
        self._pending.add(offset)

    def mark_done(self, offset: int) -> None:
        """Record that the run at ``offset`` finished (or was skipped) for good."""
        if offset not in self._pending:
            return
        self._pending.discard(offset)
        while self._entries and self._entries[0] not in self._pending:
            self._watermark = self._entries.popleft() + 1

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def watermark(self) -> int | None:
        """The offset to commit (next to read), or None before the first run finished."""
        return self._watermark

    def to_commit(self) -> int | None:
        """The watermark if it moved since :meth:`committed` was last called, else None."""
        if self.revoked or self._watermark is None or self._watermark == self._committed:
            return None
        return self._watermark

    def committed(self, offset: int) -> None:
        self._committed = offset


class LatestAttempts:
    """The latest attempt and the highest fencing token dispatched per run id, in bounded LRU
    memory.

    The scheduler only re-dispatches a run with a higher attempt, so a lower attempt arriving
    later is an old record (a re-fire after a scheduler crash, a redelivery after a rebalance)
    whose attempt the scheduler has already given up on. Running it again would race the newer
    attempt. Likewise a lower fencing token than one already seen *for the same run* comes from
    an owner that has since been replaced.

    Everything is kept per run, never per partition: a forged or corrupt record can then only
    make later records of its own run id look stale, never a whole partition's (a partition-wide
    "highest token" let one record with a token from the future fence every later run). Fencing
    proper is the broker's: a replaced owner's transactions abort, and workers read
    ``read_committed``.

    Memory is bounded: forgetting a very old run only costs the ability to recognise its stale
    records, which then run (at-least-once), never a lost run.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._latest: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def observe(self, run_id: str, attempt: int, fencing_token: int = 0) -> str | None:
        """Record a dispatched attempt; returns why it is stale, or None when it may run."""
        latest = self._latest.get(run_id)
        if latest is None:
            self._latest[run_id] = (attempt, fencing_token)
            if len(self._latest) > self.capacity:
                self._latest.popitem(last=False)
            return None
        self._latest.move_to_end(run_id)
        seen_attempt, seen_token = latest
        if fencing_token < seen_token:
            return f"fenced: token {fencing_token} < {seen_token}"
        if attempt < seen_attempt:
            return (
                f"stale attempt: {attempt} < {seen_attempt}, a newer attempt of this run was "
                "already dispatched"
            )
        if attempt != seen_attempt or fencing_token != seen_token:
            self._latest[run_id] = (attempt, fencing_token)
        return None

    def newer_attempt(self, run_id: str, attempt: int) -> int | None:
        """The latest attempt seen for ``run_id`` if it is newer than ``attempt`` (a run that
        waited in the local backlog while its next attempt arrived); LRU order untouched."""
        latest = self._latest.get(run_id)
        return latest[0] if latest is not None and latest[0] > attempt else None

    def __len__(self) -> int:
        return len(self._latest)
