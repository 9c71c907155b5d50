"""Pure bookkeeping of the worker pool: commit watermarks, latest attempts, fencing tokens.

Kept free of Kafka and asyncio so the rules that decide what is committed and what is dropped as
STALE are unit-tested directly.
"""

from __future__ import annotations

from collections import OrderedDict, deque

#: Prefix of the commit metadata this worker writes next to a committed offset: the offsets
#: past it that are done already, the runs started up to where, and since when a verdict not
#: named there can be on the acks topic (version 2 of the format).
METADATA_PREFIX = "jw2:"
#: Version 1, read still (a worker of the version before): no lookup time.
_METADATA_V1 = "jw1:"
#: Between the done ranges (with the started mark) and the lookup time, in base 36.
_SINCE_MARK = "@"
#: Metadata kept under the broker's ``offset.metadata.max.bytes`` (4,096 by default) with room
#: to spare: a commit whose metadata is too large is refused as a whole.
METADATA_MAX_CHARS = 3_000


class OffsetTracker:
    """Which offset of one partition is safe to commit, and which runs past it are done.

    Runs finish out of order (a 1 s task fetched after a 1 h one finishes first), but a committed
    offset means "everything before it is done". So the tracker keeps the fetched offsets in order
    with a done flag and commits up to the first one still pending: the contiguous watermark.
    A crash then re-delivers every unfinished run, never skips one.

    The runs done *past* the watermark go with the commit as its metadata
    (:meth:`done_metadata`), and the partition's next owner skips them (:meth:`inherit`): a run
    that finished behind a longer one is not run again after a rebalance or a crash. Without
    that, every run finished after the oldest one in flight ran twice, with the same attempt.

    Offsets arrive in increasing order per partition (Kafka guarantees it within an assignment);
    gaps (transaction markers, aborted records under ``read_committed``) are harmless because only
    fetched offsets are tracked.
    """

    __slots__ = (
        "partition",
        "revoked",
        "closing",
        "_entries",
        "_pending",
        "_owned",
        "_inherited",
        "_done_below",
        "_suspect_high",
        "_watermark",
        "_committed",
        "_committed_meta",
        "lookup_since_ms",
        "decided",
        "decided_below",
    )

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.revoked = False
        #: Being revoked: no run of it starts any more (its in-flight runs may finish).
        self.closing = False
        self._entries: deque[int] = deque()  # fetched offsets, ascending, done or not
        self._pending: set[int] = set()  # fetched offsets not done yet
        self._owned: set[int] = set()  # pending offsets whose run started or has a verdict
        self._inherited: set[int] = set()  # done by the previous owner, not fetched yet
        self._done_below: int | None = None  # this process ran every offset below it already
        self._suspect_high: int | None = None  # the previous owner had started runs up to it
        self._watermark: int | None = None
        self._committed: int | None = None
        self._committed_meta = ""
        #: From the previous owner's last commit: verdicts of runs past it that it did not
        #: name as done may be on the acks topic from this time on (its clock, in ms).
        self.lookup_since_ms: int | None = None
        #: (run id, attempt) of the runs a worker gave a verdict on, read from the acks topic
        #: when this ownership began; a fetched run of them is done, not run again.
        self.decided: set[tuple[str, int]] = set()
        #: Only runs below this offset (the partition's end when the acks were read) can be
        #: in :attr:`decided`: the previous owner never fetched a later one.
        self.decided_below = 0

    def known_done(self) -> tuple[int | None, set[int]]:
        """What this ownership knows is done, whether or not a commit said so: every offset
        below the watermark, and the offsets done past it. Kept when the partition goes, for
        the next assignment of the same process (:meth:`inherit`)."""
        return self._watermark, {o for o in self._entries if o not in self._pending}

    def inherit(
        self,
        committed: int,
        metadata: str,
        remembered: tuple[int | None, set[int]] | None = None,
    ) -> int:
        """Take over what the previous owner committed: ``metadata`` names the offsets past
        ``committed`` it had finished. Returns how many; metadata of another format (or none)
        is ignored (those runs are then delivered again, as before).

        ``remembered`` is :meth:`known_done` of this process's own last ownership of the
        partition. It matters when that ownership ended without its commits reaching the
        group coordinator (the session lost in a network partition, a coordinator gone): the
        committed offset is then behind what this process ran, and without it every run
        since the last commit that got through ran again here, with the same attempt."""
        if remembered is not None:
            watermark, past = remembered
            if watermark is not None and watermark > committed:
                self._done_below = watermark
            self._inherited.update(o for o in past if o >= max(committed, 0))
        if committed < 0 or not metadata.startswith((METADATA_PREFIX, _METADATA_V1)):
            return len(self._inherited)
        done: set[int] = set()
        body, _, since = metadata[len(METADATA_PREFIX) :].partition(_SINCE_MARK)
        ranges, _, started = body.partition("|")
        try:
            if since and metadata.startswith(METADATA_PREFIX):
                self.lookup_since_ms = int(since, 36)
            if started:
                self._suspect_high = committed + int(started, 36)
            for part in ranges.split(","):
                if not part:
                    continue
                lo, _, hi = part.partition("-")
                first = committed + int(lo, 36)
                last = committed + int(hi, 36) if hi else first
                if last < first or last - first > 1_000_000:
                    raise ValueError(part)
                done.update(range(first, last + 1))
        except ValueError:
            return 0
        self._inherited.update(o for o in done if o > committed)
        return len(self._inherited)

    def add(self, offset: int) -> bool:
        """Track a fetched offset; False if the previous owner finished its run already (it is
        tracked as done: it must not run again)."""
        last = self._entries[-1] if self._entries else None
        if last is None and self._watermark is not None:
            last = self._watermark - 1
        if last is not None and offset <= last:
            raise ValueError(
                f"partition {self.partition}: offset {offset} after {last}; "
                "a tracker lives for one assignment, make a new one after a rebalance"
            )
        below = self._done_below is not None and offset < self._done_below
        if below or offset in self._inherited:
            self._inherited.discard(offset)
            if self._entries:
                self._entries.append(offset)  # done, behind a pending one
            else:
                self._watermark = offset + 1
            return False
        self._entries.append(offset)
        self._pending.add(offset)
        return True

    def maybe_repeat(self, offset: int) -> bool:
        """Whether the run at ``offset`` may have been executing on the previous owner when it
        went away (it had started runs up to a later offset, and did not finish this one)."""
        return self._suspect_high is not None and offset <= self._suspect_high

    def own(self, offset: int) -> None:
        """The run at ``offset`` started (or got a verdict): a revoke waits for it."""
        if offset in self._pending:
            self._owned.add(offset)

    def mark_done(self, offset: int) -> None:
        """Record that the run at ``offset`` finished (or was skipped) for good."""
        if offset not in self._pending:
            return
        self._pending.discard(offset)
        self._owned.discard(offset)
        while self._entries and self._entries[0] not in self._pending:
            self._watermark = self._entries.popleft() + 1

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def owned(self) -> int:
        """Runs started (or with a verdict on its way) and not acknowledged yet."""
        return len(self._owned)

    @property
    def tracked(self) -> int:
        """Offsets kept from the oldest pending one on: what the pool bounds by pausing."""
        return len(self._entries)

    @property
    def watermark(self) -> int | None:
        """The offset to commit (next to read), or None before the first run finished."""
        return self._watermark

    def done_metadata(self, since_ms: int | None = None) -> str:
        """The commit metadata of the watermark: the offsets past it that are done (fetched
        and finished, or inherited and not fetched yet), as base-36 ranges relative to the
        watermark. Cut to :data:`METADATA_MAX_CHARS` (the runs left out would run again).

        ``since_ms``: now, when runs of the partition may still get a verdict after this
        commit (this ownership goes on fetching and running them). A crash or a lost session
        then leaves those verdicts out of every commit that gets through; the next owner reads
        them from the acks topic from this time on (:attr:`lookup_since_ms`) instead of running
        those runs again. None for a hand-over with nothing running: nothing to look up."""
        return _with_since(self._done_body(), since_ms)

    def _done_body(self) -> str:
        base = self._base()
        if base is None:
            return ""
        done = [o for o in self._entries if o not in self._pending and o > base]
        done.extend(sorted(o for o in self._inherited if o > base))
        # The runs executing: a crash makes the next owner run them again, and it says so.
        started = f"|{_b36(max(self._owned) - base)}" if self._owned else ""
        if not done:
            return METADATA_PREFIX + started if started else ""
        parts: list[str] = []
        size = len(METADATA_PREFIX)
        start = prev = done[0]
        for o in [*done[1:], None]:
            if o is not None and o == prev + 1:
                prev = o
                continue
            lo = _b36(start - base)
            part = lo if start == prev else f"{lo}-{_b36(prev - base)}"
            if size + len(part) + 1 > METADATA_MAX_CHARS:
                break
            parts.append(part)
            size += len(part) + 1
            if o is not None:
                start = prev = o
        return METADATA_PREFIX + ",".join(parts) + started

    def _base(self) -> int | None:
        """The offset to commit: the watermark, or before the first run finished the first
        fetched offset (committing it says nothing is done, but carries the metadata)."""
        if self._watermark is not None:
            return self._watermark
        return self._entries[0] if self._entries else None

    def to_commit(self, since_ms: int | None = None) -> tuple[int, str] | None:
        """The watermark and its metadata if either changed since :meth:`committed` (the
        lookup time alone is no change: an older one only makes the next owner read more)."""
        base = self._base()
        if self.revoked or base is None:
            return None
        body = self._done_body()
        if not body and self._watermark is None:
            return None
        if base == self._committed and body == self._committed_meta:
            return None
        return base, _with_since(body, since_ms)

    def committed(self, offset: int, metadata: str = "") -> None:
        self._committed = offset
        body = metadata.partition(_SINCE_MARK)[0]
        self._committed_meta = "" if body == METADATA_PREFIX else body

    def decided_elsewhere(self, offset: int, run_id: str, attempt: int) -> bool:
        """Whether a worker gave its verdict on this attempt already (read from the acks topic
        when this ownership began): the run is done, not run again. Forgets the lookup once
        the fetch is past what the previous owner can have fetched."""
        if not self.decided:
            return False
        if offset >= self.decided_below:
            self.decided = set()
            return False
        return (run_id, attempt) in self.decided


def _with_since(body: str, since_ms: int | None) -> str:
    """The done ranges ``body`` with the lookup time (:meth:`OffsetTracker.done_metadata`)."""
    if since_ms is None:
        return body
    return (body or METADATA_PREFIX) + _SINCE_MARK + _b36(since_ms)


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


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

    It also remembers whether this process finished the latest attempt (its verdict
    acknowledged by the broker: :meth:`finish`). A record of that attempt fetched again is then
    done, not run again, however it came back: a partition lost while the verdict was on its
    way and regained after the broker took it (the commit before the loss never got through,
    so the new ownership fetches the run again), a re-dispatch of the same attempt by a new
    scheduler owner. The offsets' bookkeeping cannot see those: the verdict landed after the
    ownership that ran it was gone.

    Memory is bounded: forgetting a very old run only costs the ability to recognise its stale
    records, which then run (at-least-once), never a lost run.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        #: run id -> (latest attempt, highest fencing token, that attempt finished here)
        self._latest: OrderedDict[str, tuple[int, int, bool]] = OrderedDict()

    def observe(self, run_id: str, attempt: int, fencing_token: int = 0) -> str | None:
        """Record a dispatched attempt; returns why it is stale, or None when it may run."""
        latest = self._latest.get(run_id)
        if latest is None:
            self._remember(run_id, (attempt, fencing_token, False))
            return None
        self._latest.move_to_end(run_id)
        seen_attempt, seen_token, finished = latest
        if fencing_token < seen_token:
            return f"fenced: token {fencing_token} < {seen_token}"
        if attempt < seen_attempt:
            return (
                f"stale attempt: {attempt} < {seen_attempt}, a newer attempt of this run was "
                "already dispatched"
            )
        if attempt != seen_attempt:
            self._latest[run_id] = (attempt, fencing_token, False)
        elif fencing_token != seen_token:  # the same attempt sent again by a newer owner
            self._latest[run_id] = (attempt, fencing_token, finished)
        return None

    def finish(self, run_id: str, attempt: int, fencing_token: int) -> None:
        """This process ran ``attempt`` and the broker has its verdict. Only the latest
        attempt is marked (an older one is stale anyway)."""
        latest = self._latest.get(run_id)
        if latest is None:
            self._remember(run_id, (attempt, fencing_token, True))
        elif latest[0] == attempt:
            self._latest[run_id] = (attempt, latest[1], True)

    def finished(self, run_id: str, attempt: int) -> bool:
        """Whether this process finished ``attempt`` of ``run_id`` (see :meth:`finish`)."""
        latest = self._latest.get(run_id)
        return latest is not None and latest[0] == attempt and latest[2]

    def _remember(self, run_id: str, entry: tuple[int, int, bool]) -> None:
        self._latest[run_id] = entry
        if len(self._latest) > self.capacity:
            self._latest.popitem(last=False)

    def newer_attempt(self, run_id: str, attempt: int) -> int | None:
        """The latest attempt seen for ``run_id`` if it is newer than ``attempt`` (a run that
        waited in the local backlog while its next attempt arrived); LRU order untouched."""
        latest = self._latest.get(run_id)
        return latest[0] if latest is not None and latest[0] > attempt else None

    def __len__(self) -> int:
        return len(self._latest)
