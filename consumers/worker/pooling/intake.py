"""The consumer side of the pool: partitions assigned and revoked, fetching and decoding runs,
offsets that are done, committing them."""

from __future__ import annotations

import asyncio
import logging
import time

from jobwheel.consumers.worker.executor import Outcome
from jobwheel.consumers.worker.kafka import COMMIT_TIMEOUT_S, Record, read_acks_since
from jobwheel.consumers.worker.pooling.core import (
    COMMIT_REFRESH_S,
    FETCH_BATCH,
    FULL_WAIT_S,
    LAG_SAMPLE_S,
    MEMBERSHIP_CHECK_S,
    MIN_OUTSIDE_S,
    OUTSIDE_SESSIONS,
    POLL_TIMEOUT_S,
    REVOKE_HAND_BACK_S,
    SETTLE_SLICE_S,
    TRACKED_LIMIT,
    PoolCore,
    _Execution,
    _in_daemon_thread,
    log,
)
from jobwheel.consumers.worker.tracking import OffsetTracker
from jobwheel.errors import BrokerError, SchemaDecodeError
from jobwheel.schemas.models import Run, State, StatusEvent

#: Back from the previous owner's lookup time: an ack appended (broker time) a little before
#: the commit that did not name its run as done (its delivery report not in yet), and the
#: distance between that worker's clock and the broker's.
ACKS_LOOKUP_MARGIN_MS = 30_000
#: Bounds of that read, in the assignment callback: past them, the runs whose acks were not
#: read run again (at-least-once, as without the lookup).
ACKS_LOOKUP_TIMEOUT_S = 20.0
ACKS_LOOKUP_LIMIT = 2_000_000
#: Acks that say a run is under way, not decided.
_PROGRESS = frozenset({State.STARTED, State.HEARTBEAT})


class Intake(PoolCore):
    def _on_assign(self, partitions: list[int]) -> None:
        self.joined = True
        trackers = {p: OffsetTracker(p) for p in partitions}
        self._inherit(trackers)
        with self._lock:
            self._trackers.update(trackers)
            self._held.difference_update(partitions)
        if partitions:  # cooperative rebalances also report empty increments
            log.info("partitions assigned", extra={"partitions": sorted(partitions)})

    def _inherit(self, trackers: dict[int, OffsetTracker]) -> None:
        """Read which runs past the committed offsets the previous owners finished (the commit
        metadata), so they are skipped instead of run again. Bounded; failing that, those runs
        are delivered again (at-least-once, as without the metadata)."""
        if not trackers:
            return
        assert self._consumer is not None
        try:
            committed = self._consumer.committed(list(trackers), COMMIT_TIMEOUT_S)
        except BrokerError as exc:
            log.warning(
                "committed offsets not read; runs the previous owner finished past them run again",
                extra={"partitions": sorted(trackers), "error": str(exc)},
            )
            return
        for p, (offset, metadata) in committed.items():
            done = trackers[p].inherit(offset, metadata, self._remembered.pop(p, None))
            if done:
                log.info(
                    "runs finished by the previous owner are skipped",
                    extra={"partition": p, "committed": offset, "done_past_it": done},
                )
        self._look_up_acks(trackers)

    def _look_up_acks(self, trackers: dict[int, OffsetTracker]) -> None:
        """Read the acks the previous owners gave since their last commit that got through,
        so the runs they finished are done here, not run again. Their commits could not say
        so when the ownership ended without a final commit: a crash, or a session lost while
        the broker was unreachable, when the process, alive, had run and acknowledged runs it
        could not commit any more. Bounded; failing that, those runs run again."""
        since = {
            p: t.lookup_since_ms - ACKS_LOOKUP_MARGIN_MS
            for p, t in trackers.items()
            if t.lookup_since_ms is not None
        }
        if not since:
            return
        began = time.monotonic()
        try:
            found = read_acks_since(
                self.settings, self._runs_topic, since, ACKS_LOOKUP_TIMEOUT_S, ACKS_LOOKUP_LIMIT
            )
        except BrokerError as exc:
            log.warning(
                "acks of the previous owner not read; runs it finished without a commit may "
                "run again",
                extra={"partitions": sorted(since), "error": str(exc)},
            )
            return
        decided: dict[int, set[tuple[str, int]]] = {p: set() for p in since}
        for record in found.records:
            try:
                event = self._codec.decode(record.value) if record.value is not None else None
            except SchemaDecodeError:
                continue  # not an ack this worker reads; the scheduler dead-letters it
            if (
                isinstance(event, StatusEvent)
                and event.run_id is not None
                and event.state not in _PROGRESS
                and record.partition in decided
            ):
                decided[record.partition].add((event.run_id, event.attempt))
        for p, keys in decided.items():
            trackers[p].decided = keys
            trackers[p].decided_below = found.runs_ends.get(p, 0)
        log.log(
            logging.INFO if found.complete else logging.WARNING,
            "acks since the previous owners' last commits read"
            + ("" if found.complete else " in part (bounded); the runs of the rest may run again"),
            extra={
                "partitions": sorted(since),
                "acks_read": len(found.records),
                "runs_decided": sum(len(k) for k in decided.values()),
                "ms": round((time.monotonic() - began) * 1000),
            },
        )

    def _on_revoke(self, partitions: list[int]) -> None:
        """Hand the partitions over with nothing left to run twice: no run of theirs starts any
        more, the runs executing get the grace period to finish (their verdicts delivered),
        what still runs after it is handed back (a new attempt), and the commit names every run
        done, also those past the oldest unfinished one. Before, the commit stopped at the
        oldest run in flight while those runs went on: the new owner ran again each of them and
        every run finished after it, with the same attempt."""
        with self._lock:
            trackers = [self._trackers[p] for p in partitions if p in self._trackers]
            for tracker in trackers:
                tracker.closing = True
        if trackers:
            self._settle(trackers)
        # Closing: the final commit was confirmed just before leaving the group (in _leave);
        # only what moved since is committed here.
        self._commit(asynchronous=False, only=set(partitions), final=not self._closing)
        self._drop(partitions)
        if partitions:
            log.info("partitions revoked", extra={"partitions": sorted(partitions)})

    def _settle(self, trackers: list[OffsetTracker]) -> None:
        """Consumer thread, in the revoke: wait for the revoked partitions' started runs to be
        acknowledged, for the grace period; then hand back those still running and wait for
        those verdicts, for :data:`REVOKE_HAND_BACK_S`. Both waits are bounded: a broker that
        does not take the verdicts leaves those runs to the next owner."""

        def owned() -> int:
            return sum(t.owned for t in trackers)

        def wait(until: float) -> None:
            with self._lock:
                while owned() and not self._hurry_seen and time.monotonic() < until:
                    self._lock.wait(min(SETTLE_SLICE_S, max(0.0, until - time.monotonic())))

        if owned():
            log.info(
                "partitions revoked: waiting for their runs to finish",
                extra={"partitions": [t.partition for t in trackers], "running": owned()},
            )
        wait(time.monotonic() + self.grace_s)
        if not owned():
            return
        self._threadsafe(self._hand_back_revoked)
        wait(time.monotonic() + REVOKE_HAND_BACK_S)
        if owned():
            log.warning(
                "revoked partitions handed over with runs unacknowledged; the next owner "
                "delivers them again",
                extra={"partitions": [t.partition for t in trackers], "runs": owned()},
            )

    def _on_lost(self, partitions: list[int]) -> None:
        self._drop(partitions)  # another member may own them already: commit nothing
        if partitions:
            log.warning("partitions lost", extra={"partitions": sorted(partitions)})
            self._stop_rejoining = self.settings.worker_fault_stop_rejoining

    def _check_membership(self, now: float) -> None:
        """Consumer thread: replace a runs consumer that has stayed out of its group.

        Seen in a loop of short broker restarts (2 runs in 10): the consumer (classic
        protocol) timed out its session while the broker was down and lost its partitions;
        librdkafka then waited in join state wait-incr-unassign-to-complete for an offset
        commit sent during the outage that never completed, so it never joined the group
        again (4 minutes, the broker up) while the worker went on polling it; its runs waited
        and nothing said why. The sign: no partition and no member id (the
        coordinator has not taken it into the group) for several session timeouts, counted
        only while Kafka accepts connections (during an outage nobody can join). Then the
        consumer is closed, in a daemon thread as a wedged client may block there, and a new
        one joins the group. A worker in a group with more members than partitions has a
        member id and no partition: it stays as it is."""
        assert self._consumer is not None
        if self._trackers or self._consumer.member_id() or not self._reachable():
            self._outside_since = None
            return
        if self._outside_since is None:
            self._outside_since = now
            return
        limit = max(MIN_OUTSIDE_S, OUTSIDE_SESSIONS * self._consumer.session_timeout_s())
        if now - self._outside_since < limit:
            return
        log.warning(
            "the runs consumer has not been in its group for a while with Kafka reachable; "
            "replacing it",
            extra={"group": self.group, "outside_s": round(now - self._outside_since)},
        )
        self._outside_since = None
        old, self._consumer = self._consumer, self._new_consumer()
        self._paused_parts = set()
        _in_daemon_thread(old.close, "jobwheel-consumer-replaced")  # holds no partition
        self._consumer.subscribe(self._on_assign, self._on_revoke, self._on_lost)
        self.meters.consumers_replaced += 1

    def _drop(self, partitions: list[int]) -> None:
        with self._lock:
            for p in partitions:
                tracker = self._trackers.pop(p, None)
                if tracker is not None:
                    tracker.revoked = True
                    # If this process gets the partition back before a commit of its runs
                    # reached the broker, it does not run them again (OffsetTracker.inherit).
                    self._remembered[p] = tracker.known_done()
                self._held.discard(p)

    def _commit(
        self, *, asynchronous: bool, only: set[int] | None = None, final: bool = False
    ) -> None:
        """Commit watermarks that moved (``final``: every known watermark, synchronously)."""
        offsets = self._final_offsets(only) if final else self._moved_offsets(only)
        self._commit_offsets(offsets, asynchronous=asynchronous)

    def _moved_offsets(self, only: set[int] | None = None) -> dict[int, tuple[int, str]]:
        """Watermarks (and the runs done past them) that moved since they were last committed,
        of partitions still ours."""
        with self._lock:
            offsets: dict[int, tuple[int, str]] = {}
            for p, tracker in self._trackers.items():
                if only is not None and p not in only:
                    continue
                commit = tracker.to_commit(self._clock.now_ms())
                if commit is not None:
                    offsets[p] = commit
            return offsets

    def _final_offsets(self, only: set[int] | None = None) -> dict[int, tuple[int, str]]:
        """Every known watermark of partitions still ours: a final commit repeats those already
        committed asynchronously, whose outcome was never checked."""
        with self._lock:
            offsets: dict[int, tuple[int, str]] = {}
            for p, tracker in self._trackers.items():
                offset = tracker.watermark if not tracker.revoked else None
                if offset is not None and (only is None or p in only):
                    offsets[p] = (offset, tracker.done_metadata(self._lookup_since(tracker)))
            return offsets

    def _lookup_since(self, tracker: OffsetTracker) -> int | None:
        """The lookup time of a commit (:meth:`OffsetTracker.done_metadata`): none for a
        hand-over with no run of the partition started and unacknowledged, now otherwise."""
        handing_over = tracker.closing or self._closing
        return None if handing_over and not tracker.owned else self._clock.now_ms()

    def _commit_offsets(self, offsets: dict[int, tuple[int, str]], *, asynchronous: bool) -> bool:
        """Commit ``partition -> (watermark, metadata)``; False if the client refused or a
        synchronous commit got no answer in time (logged)."""
        if not offsets:
            return True
        assert self._consumer is not None
        try:
            self._consumer.commit(offsets, asynchronous=asynchronous)
        except BrokerError as exc:
            log.warning(
                "offset commit failed",
                extra={"offsets": {p: o for p, (o, _m) in offsets.items()}, "error": str(exc)},
            )
            return False
        with self._lock:
            for p, (offset, metadata) in offsets.items():
                tracker = self._trackers.get(p)
                if tracker is not None:
                    tracker.committed(offset, metadata)
        return True

    def _flow(self, pause: bool) -> None:
        """Pause every partition (``pause``: backlog full, or draining), else only those
        holding :data:`TRACKED_LIMIT` offsets behind an unfinished run (resumed at half): a
        1-hour run at 1,000 runs/s would otherwise keep 3.6 M offsets."""
        assert self._consumer is not None
        with self._lock:
            for p, tracker in self._trackers.items():
                if tracker.tracked >= TRACKED_LIMIT and p not in self._held:
                    self._held.add(p)
                    log.warning(
                        "partition paused: too many runs finished behind an unfinished one",
                        extra={"partition": p, "tracked": tracker.tracked},
                    )
                elif p in self._held and tracker.tracked <= TRACKED_LIMIT // 2:
                    self._held.discard(p)
            assigned = set(self._trackers)
            wanted = assigned if pause else self._held & assigned
        self._paused_parts &= assigned
        if wanted - self._paused_parts:
            self._consumer.pause(sorted(wanted - self._paused_parts))
        if self._paused_parts - wanted:
            self._consumer.resume(sorted(self._paused_parts - wanted))
        self._paused_parts = wanted

    def _poll_step(self, pause: bool) -> list[tuple[OffsetTracker, Record]]:
        """One consumer-thread iteration: flow control, periodic commit, fetch."""
        assert self._consumer is not None
        self._flow(pause)
        now = time.monotonic()
        if now - self._last_commit >= self._commit_interval_s:
            self._last_commit = now
            # Every COMMIT_REFRESH_S, every watermark again, moved or not: an asynchronous
            # commit's outcome is never checked, so one the broker did not take (its
            # coordinator not back yet after a freeze) was never sent again while its
            # partition stayed idle, and the run was delivered again to the next owner.
            refresh = now - self._last_refresh >= COMMIT_REFRESH_S
            if refresh:
                self._last_refresh = now
            self._commit(asynchronous=True, final=refresh)
        if self._stop_rejoining:  # fault injection (worker_fault_stop_rejoining)
            self._stop_rejoining = False
            log.warning("fault injection: the runs consumer leaves its group for good")
            self._consumer.unsubscribe()
        if now - self._membership_at >= MEMBERSHIP_CHECK_S and not self._draining:
            self._membership_at = now
            self._check_membership(now)
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
        skipped = 0
        with self._lock:
            for record in records:
                tracker = self._trackers.get(record.partition)
                if tracker is None:
                    continue  # not ours (any more): the owner gets it
                try:
                    if not tracker.add(record.offset):
                        skipped += 1  # the previous owner finished it
                        continue
                except ValueError:
                    log.debug("re-fetched record ignored", extra={"offset": record.offset})
                    continue
                out.append((tracker, record))
        if skipped:
            self.meters.inherited_done += skipped
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
        """A record that is not a Run is not retried (bytes no reader here understands would
        block the partition for ever): it is dead-lettered, its run answered FAILED when the
        record names it, and committed past once the broker has both
        (:mod:`.undecodable`)."""
        try:
            if record.value is None:
                raise SchemaDecodeError("the record has no value (a tombstone?)")
            value = self._codec.decode(record.value)
            if not isinstance(value, Run):
                raise SchemaDecodeError(f"expected a Run, got a {type(value).__name__}")
        except SchemaDecodeError as exc:
            self._undecodable(tracker, record, str(exc))
            return None
        return value

    def _accept(self, tracker: OffsetTracker, record: Record) -> None:
        """Decide before executing: stale (emit STALE), duplicate (join the execution of the same
        attempt), else queue it."""
        run = self._decode(tracker, record)
        if run is None or tracker.revoked or tracker.closing:
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
                    if known.prepared is not None or known.outcome is not None:
                        tracker.own(record.offset)
            self._hook("after_skip", run, None, "duplicate delivery of a known attempt")
            return
        if tracker.decided_elsewhere(record.offset, run.run_id, run.attempt):
            # The previous owner ran it and its verdict is on the acks topic, but no commit of
            # it got through (a crash, a session lost with the broker out of reach).
            self.meters.inherited_done += 1
            self._done([(tracker, record.offset)])
            self._hook("after_skip", run, None, "a worker gave its verdict on this attempt already")
            return
        if self._latest.finished(run.run_id, run.attempt):
            # Ran here already and its verdict is on the acks topic: fetched again because the
            # partition came back before a commit of it got through (LatestAttempts).
            self._done([(tracker, record.offset)])
            self._hook("after_skip", run, None, "this worker ran this attempt already")
            return
        execution = _Execution(run, [(tracker, record.offset)])
        execution.repeat = tracker.maybe_repeat(record.offset)
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
