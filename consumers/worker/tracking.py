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
    """The highest attempt dispatched per run id, in bounded LRU memory.

    The scheduler only re-dispatches a run with a higher attempt, so a lower attempt arriving
    later is an old record (a re-fire after a scheduler crash, a redelivery after a rebalance)
    whose attempt the scheduler has already given up on. Running it again would race the newer
    attempt. Memory is bounded: forgetting a very old run only costs the ability to recognise its
    stale records, which then run (at-least-once), never a lost run.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._latest: OrderedDict[str, int] = OrderedDict()

    def observe(self, run_id: str, attempt: int) -> int | None:
        """Record a dispatched attempt; returns the newer attempt if this one is stale."""
        latest = self._latest.get(run_id)
        if latest is not None:
            self._latest.move_to_end(run_id)
            if attempt < latest:
                return latest
            if attempt == latest:
                return None
        self._latest[run_id] = attempt
        self._latest.move_to_end(run_id)
        while len(self._latest) > self.capacity:
            self._latest.popitem(last=False)
        return None

    def __len__(self) -> int:
        return len(self._latest)


class FencingTokens:
    """The highest fencing token seen per scheduler partition.

    A new owner of a scheduler partition dispatches with a higher token (its ownership epoch).
    A run carrying a lower token than one already seen for its partition comes from an owner
    that has been replaced (fenced), so its dispatch decision is not authoritative.
    """

    def __init__(self) -> None:
        self._max: dict[int, int] = {}

    def observe(self, partition: int, token: int) -> int | None:
        """Record a token; returns the higher token already seen if this one is fenced."""
        current = self._max.get(partition)
        if current is not None and token < current:
            return current
        self._max[partition] = token
        return None

    def get(self, partition: int) -> int | None:
        return self._max.get(partition)
