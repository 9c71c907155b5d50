"""The consumer side of the pool: partitions assigned and revoked, fetching and decoding runs,
offsets that are done, committing them."""

from __future__ import annotations

import asyncio
import time

from jobwheel.consumers.worker.executor import Outcome
from jobwheel.consumers.worker.kafka import Record
from jobwheel.consumers.worker.pooling.core import (
    FETCH_BATCH,
    FULL_WAIT_S,
    LAG_SAMPLE_S,
    POLL_TIMEOUT_S,
    PoolCore,
    _Execution,
    log,
)
from jobwheel.consumers.worker.tracking import OffsetTracker
from jobwheel.errors import BrokerError, SchemaDecodeError
from jobwheel.schemas.models import Run, State


class Intake(PoolCore):
    def _on_assign(self, partitions: list[int]) -> None:
        self.joined = True
        with self._lock:
            for p in partitions:
                self._trackers[p] = OffsetTracker(p)
        if partitions:  # cooperative rebalances also report empty increments
            log.info("partitions assigned", extra={"partitions": sorted(partitions)})

    def _on_revoke(self, partitions: list[int]) -> None:
        self._commit(asynchronous=False, only=set(partitions), final=True)
        self._drop(partitions)
        if partitions:
            log.info("partitions revoked", extra={"partitions": sorted(partitions)})

    def _on_lost(self, partitions: list[int]) -> None:
        self._drop(partitions)  # another member may own them already: commit nothing
        if partitions:
            log.warning("partitions lost", extra={"partitions": sorted(partitions)})

    def _drop(self, partitions: list[int]) -> None:
        with self._lock:
            for p in partitions:
                tracker = self._trackers.pop(p, None)
                if tracker is not None:
                    tracker.revoked = True

    def _commit(
        self, *, asynchronous: bool, only: set[int] | None = None, final: bool = False
    ) -> None:
        """Commit watermarks that moved (``final``: every known watermark, synchronously)."""
        offsets = self._final_offsets(only) if final else self._moved_offsets(only)
        self._commit_offsets(offsets, asynchronous=asynchronous)

    def _moved_offsets(self, only: set[int] | None = None) -> dict[int, int]:
        """Watermarks that moved since they were last committed, of partitions still ours."""
        with self._lock:
            offsets: dict[int, int] = {}
            for p, tracker in self._trackers.items():
                offset = tracker.to_commit()
                if offset is not None and (only is None or p in only):
                    offsets[p] = offset
            return offsets

    def _final_offsets(self, only: set[int] | None = None) -> dict[int, int]:
        """Every known watermark of partitions still ours: a final commit repeats those already
        committed asynchronously, whose outcome was never checked."""
        with self._lock:
            offsets: dict[int, int] = {}
            for p, tracker in self._trackers.items():
                offset = tracker.watermark if not tracker.revoked else None
                if offset is not None and (only is None or p in only):
                    offsets[p] = offset
            return offsets

    def _commit_offsets(self, offsets: dict[int, int], *, asynchronous: bool) -> bool:
        """Commit ``partition -> watermark``; False if the client refused (logged). A
        synchronous commit blocks for as long as the broker is unreachable."""
        if not offsets:
            return True
        assert self._consumer is not None
        try:
            self._consumer.commit(offsets, asynchronous=asynchronous)
        except BrokerError as exc:
            log.warning("offset commit failed", extra={"offsets": offsets, "error": str(exc)})
            return False
        with self._lock:
            for p, offset in offsets.items():
                tracker = self._trackers.get(p)
                if tracker is not None:
                    tracker.committed(offset)
        return True

    def _poll_step(self, pause: bool) -> list[tuple[OffsetTracker, Record]]:
        """One consumer-thread iteration: flow control, periodic commit, fetch."""
        assert self._consumer is not None
        if pause:
            self._consumer.pause(self._consumer.assignment())
            self._paused = True
        elif self._paused:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False
        now = time.monotonic()
        if now - self._last_commit >= self._commit_interval_s:
            self._last_commit = now
            self._commit(asynchronous=True)
        if now - self._lag_at >= LAG_SAMPLE_S:
            self._lag_at = now
            self.lag = self._consumer.lag()
        # Take what is there without waiting; with nothing there, wait for the first record
        # only (a batch call would hold early records back until the batch fills or times
        # out), no longer than until the next commit is due.
        records = self._consumer.consume(FETCH_BATCH, 0)
        if not records:
            timeout = min(POLL_TIMEOUT_S, max(0.005, self._commit_interval_s))
            records = self._consumer.consume(1, timeout)
            if records:
                records += self._consumer.consume(FETCH_BATCH - 1, 0)
        out: list[tuple[OffsetTracker, Record]] = []
        with self._lock:
            for record in records:
                tracker = self._trackers.get(record.partition)
                if tracker is None:
                    continue  # not ours (any more): the owner gets it
                try:
                    tracker.add(record.offset)
                except ValueError:
                    log.debug("re-fetched record ignored", extra={"offset": record.offset})
                    continue
                out.append((tracker, record))
        return out

    async def _fetch_loop(self) -> None:
        """Poll until closing, in batches, handing every record to :meth:`_accept`.

        Flow control: with the local backlog at its high water mark the loop stops taking
        records and waits for it to drain to half. A short wait leaves the client's prefetched
        records in place (pausing the partitions would drop them and cost a fetch round trip on
        resume, which capped a worker at about 1,200 quick runs per second). When the backlog
        stays full (long runs), the partitions are paused and polling goes on, so group
        membership and rebalance callbacks keep working; the same while draining.
        """
        while not self._closing:
            pause = self._draining
            if not pause and len(self._backlog) >= self._high_water:
                self._room.clear()
                try:
                    await asyncio.wait_for(self._room.wait(), FULL_WAIT_S)
                    continue
                except TimeoutError:
                    pause = True
            items = await self._in_consumer_thread(self._poll_step, pause)
            self._reap()
            if self._draining:
                continue  # not started: left uncommitted for the partition's next owner
            for tracker, record in items:
                self._accept(tracker, record)
            self._start_ready()

    def _decode(self, tracker: OffsetTracker, record: Record) -> Run | None:
        """A record that is not a Run is logged and skipped (and committed past): retrying
        bytes no reader understands would block the partition forever."""
        try:
            if record.value is None:
                raise SchemaDecodeError("the record has no value (a tombstone?)")
            value = self._codec.decode(record.value)
            if not isinstance(value, Run):
                raise SchemaDecodeError(f"expected a Run, got a {type(value).__name__}")
        except SchemaDecodeError as exc:
            log.error(
                "undecodable run record skipped",
                extra={
                    "topic": self._runs_topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "error": str(exc),
                },
            )
            self._done([(tracker, record.offset)])
            return None
        return value

    def _accept(self, tracker: OffsetTracker, record: Record) -> None:
        """Decide before executing: stale (emit STALE), duplicate (join the execution of the same
        attempt), else queue it."""
        run = self._decode(tracker, record)
        if run is None or tracker.revoked:
            return
        stale = self._latest.observe(run.run_id, run.attempt, run.fencing_token)
        if stale is not None:
            self._stale(run, [(tracker, record.offset)], stale)
            return
        known = self._inflight.get((run.run_id, run.attempt))
        if known is not None:
            with self._lock:
                if known.acked:  # finished and acknowledged: this copy is done as well
                    tracker.mark_done(record.offset)
                else:
                    known.offsets.append((tracker, record.offset))
            self._hook("after_skip", run, None, "duplicate delivery of a known attempt")
            return
        execution = _Execution(run, [(tracker, record.offset)])
        self._inflight[execution.key] = execution
        self._backlog.append(execution)

    def _stale(self, run: Run, offsets: list[tuple[OffsetTracker, int]], reason: str) -> None:
        """A STALE event; the offsets are done once the broker has it."""
        assert self._producer is not None
        record = self._record(self._event(run, State.STALE, reason=reason), run)
        self.meters.verdict(run.task, State.STALE.value)
        ex = _Execution(run, offsets)  # only for the delivery bookkeeping
        ex.outcome = Outcome(State.STALE, 0, reason=reason)
        self._send_verdict(ex, record)
        self._hook("after_skip", run, State.STALE, reason)

    def _done(self, offsets: list[tuple[OffsetTracker, int]]) -> None:
        with self._lock:
            for tracker, offset in offsets:
                tracker.mark_done(offset)
