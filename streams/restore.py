"""Reading the changelog (Kafka Streams' StoreChangelogReader): the restore of a claimed
partition, and the standby copies kept up to date, in slices between the loop's iterations.

**Partitions** arrive paused; their state is restored from the changelog (from the local
checkpoint, so a restart on the same disk replays only the tail) in slices between iterations,
then their inputs resume and they are *ready*. The ownership epoch (fencing token on runs) is
bumped and changelogged on every claim.

Restoring partitions are read first, the standby copies (:mod:`jobwheel.streams.tasks`) in the
time left. A claim reads the group's committed offsets before it measures the changelog's end
(:meth:`Restorer._start_restore` says why), and a restore that makes no progress for
``JOBWHEEL_SCHEDULER_RESTORE_STALL_MS`` gets a new changelog consumer
(:meth:`Restorer._restore_stalled`). A claim that cannot read those offsets or rewind its
input for as long is given up with every client (:meth:`Restorer.stuck_claim`).
"""

from __future__ import annotations

import time

from jobwheel.errors import BrokerError
from jobwheel.schemas.progress import Progress
from jobwheel.streams.core import EngineCore, _start, log
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import EPOCH_KEY
from jobwheel.streams.state.recovery import apply_batch, plan_restore, rebuild_index
from jobwheel.streams.tasks import _EPOCH, PartitionTask, Phase, Task

#: Time given to restoring per iteration while other partitions are ready.
RESTORE_SLICE_S = 0.2
#: Time given to keeping standby copies up to date per iteration.
STANDBY_SLICE_S = 0.05
#: How long one ask for a claim's committed offsets may wait while other partitions are
#: processing (the loop waits in it), and while none is (:meth:`Restorer._read_committed`).
OFFSETS_ASK_S = 0.2
OFFSETS_WAIT_S = 10.0


class Restorer(EngineCore):
    """The changelog reading of claims and standby copies (see the module doc)."""

    def _restore(self, budget_s: float) -> None:
        """Read the changelog for the partitions that need it: restoring ones first (the
        standby copies' partitions are paused meanwhile), then the standby copies, within
        ``budget_s`` (a slice between iterations while other partitions are processing)."""
        assert self.changelog is not None
        pending = [
            t for t in self.tasks.values() if t.phase is not Phase.READY and not t.restore.reading
        ]
        # The claims that asked for their committed offsets longest ago first: at most one ask
        # per iteration waits unanswered (_read_committed), and the claim behind it must not
        # keep the others from asking.
        pending.sort(key=lambda t: t.offsets_asked_at if isinstance(t, PartitionTask) else 0.0)
        self._offsets_ask_spent = False
        for task in pending:
            self._start_restore(task)
        reading = {
            t.partition: t
            for t in self.tasks.values()
            if t.phase is not Phase.READY and t.restore.reading
        }
        if not reading:
            return
        restoring = any(t.phase is Phase.RESTORING for t in reading.values())
        for task in reading.values():  # restoring partitions first
            if task.phase is Phase.STANDBY and restoring:
                self.changelog.pause(task.partition)
            else:
                self.changelog.resume(task.partition)
        deadline = time.monotonic() + (budget_s if restoring else STANDBY_SLICE_S)
        while True:
            for task in list(reading.values()):
                position = self.changelog.position(task.partition)
                if position is None or position < task.restore.end:
                    if task.phase is Phase.RESTORING:
                        self._restore_stalled(task.partition, position)
                    continue
                if task.phase is Phase.RESTORING:
                    self._finish_restore(task)
                    reading.pop(task.partition)
                elif task.restore.fresh:  # a new standby copy has caught up: index it
                    rebuild_index(task.backend)
                    task.restore.fresh = False
            if not reading or time.monotonic() >= deadline:
                return
            if restoring and not any(t.phase is Phase.RESTORING for t in reading.values()):
                return  # restored: the standby copies read again from the next iteration on
            by_partition: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
            for p, offset, key, value in self.changelog.poll_changes(20_000, 0.02):
                if p in reading and key is not None:
                    by_partition.setdefault(p, []).append((offset, key, value))
            if not by_partition and not restoring:
                return  # the standby copies are up to date
            for p, batch in by_partition.items():
                task = reading[p]
                applied = apply_batch(
                    task.backend, batch, batch[-1][0] + 1, fresh=task.restore.fresh
                )
                task.restore.applied += applied
                task.restore.next = batch[-1][0] + 1
                if isinstance(task, PartitionTask):
                    task.claim_failing_since = None  # the claim is moving
                self.meters.restored_records += applied
            self.turned_at = time.monotonic()  # a long restore is the loop at work, not hung

    def _start_restore(self, task: Task) -> None:
        """Measure what is left to read, and read it: from the local checkpoint (or from the
        start, when there is none or it does not fit) to the changelog's current end.

        A claim reads the group's committed offsets first, then measures the end. The other
        way round, a previous owner's transaction committing in between (stalled past the
        session timeout, inside its transaction timeout) left this claim with offsets past
        changelog records it never restored: the inputs they covered were lost. Read first
        (``require_stable``: the read waits for a pending transactional offset commit to end),
        every offset seen belongs to a transaction whose changelog records are below the end
        measured afterwards.

        That end is the high watermark, and the restore is done when the ``read_committed``
        reader's position reaches it: only then is every transaction under it decided on the
        changelog. A transaction whose offsets are committed can still be undecided there (its
        marker waits for a partition leader that has just moved); the last stable offset stops
        before it, and a restore to it lost what that transaction changed
        (:class:`~jobwheel.streams.kafka.ChangelogReader`). The price: a claim behind a
        transaction left open by a killed owner waits until the broker aborts it (the
        transaction timeout), as its partition's workers already wait to read past it."""
        assert self.changelog is not None
        if isinstance(task, PartitionTask) and not task.offsets_read:
            if not self._read_committed(task):
                return  # try again on the next iteration
        try:
            low, high = self.changelog.watermarks(task.partition)
        except BrokerError as exc:
            # Asked again every iteration: logged when it starts failing (and again after a
            # new changelog consumer), not on every try (the loop would write megabytes a
            # second while the broker answers at once that it does not know).
            if self._restore_stalled(task.partition, None):
                log.warning(
                    "cannot read the changelog's offsets yet",
                    extra={
                        "partition": task.partition,
                        "error": str(exc),
                        "retry": "every iteration; a new changelog consumer after "
                        "JOBWHEEL_SCHEDULER_RESTORE_STALL_MS",
                    },
                )
            return
        self._stalled_since.pop(task.partition, None)
        self.changelog.unassign(task.partition)
        if task.restore.fresh and task.phase is Phase.RESTORING:
            # A standby copy still on its first pass: carry on where it is.
            start = task.backend.checkpoint()
            plan_start, fresh = (start if start is not None else low), True
        else:
            plan = plan_restore(task.backend, low, high, now_ms=self.clock.now_ms())
            plan_start, fresh = plan.start, plan.fresh
        task.restore.end = high
        task.restore.next = plan_start
        task.restore.fresh = fresh
        task.restore.reading = True
        if isinstance(task, PartitionTask):
            log.info(
                "changelog measured",
                extra={"partition": task.partition, "restore_from": plan_start, "end": high},
            )
        if plan_start < high or task.phase is Phase.STANDBY:
            self.changelog.assign(task.partition, plan_start)
        else:
            self._finish_restore(task)

    def _restore_stalled(self, partition: int, position: int | None) -> bool:
        """Note that a restoring partition made no progress (its changelog not measured, or
        read no further than ``position``) and, once one has made none for
        JOBWHEEL_SCHEDULER_RESTORE_STALL_MS, replace the changelog consumer. True when this
        is the first note of this stall (the caller logs it once).

        Whatever holds a consumer back there (a cached metadata answer librdkafka never asks
        again, see ChangelogReader.watermarks; a fetcher that gave up), the loop goes on
        turning, so neither the loop's liveness nor the call watchdog ever sees it: without a
        bound the partition stays "restoring", its jobs unfired, for as long as the client's
        state stays wrong. A new client starts from nothing cached."""
        assert self.changelog is not None
        now = time.monotonic()
        for gone in [p for p in self._stalled_since if p not in self.tasks]:
            del self._stalled_since[gone]  # given up meanwhile: a new claim starts afresh
        seen = self._stalled_since.get(partition)
        if seen is None or seen[0] != position:
            self._stalled_since[partition] = (position, now)
            return True
        stalled_s = now - seen[1]
        if stalled_s < self.settings.scheduler_restore_stall_ms / 1000:
            return False
        task = self.tasks.get(partition)
        log.error(
            "restore made no progress; replacing the changelog consumer",
            extra={
                "partition": partition,
                "position": position,
                "end": task.restore.end if task is not None and task.restore.reading else None,
                "stalled_s": round(stalled_s, 1),
                "setting": "JOBWHEEL_SCHEDULER_RESTORE_STALL_MS",
                "causes": "a transaction under the end not decided yet (its commit marker "
                "waiting for a partition leader, or one left open until the transaction "
                "timeout aborts it), or a client's stale state",
            },
        )
        self.stats.changelog_rebuilds += 1
        self.changelog.rebuild()
        self._stalled_since.clear()
        return False

    def _read_committed(self, task: PartitionTask) -> bool:
        """The group's committed offsets of the claimed partition (see :meth:`_start_restore`);
        False when the broker cannot tell yet.

        Asked for :data:`OFFSETS_ASK_S` at a time while other partitions are processing: the
        broker holds the answer back while a previous owner's transaction with offsets for
        the partition is open (until it ends or the broker aborts it: up to the transaction
        timeout and its check, 20 s by default), and the loop waits in the ask. Asked for 10 s
        at a time, a survivor that took a stopped owner's partitions fired the jobs of its own
        partitions up to 20 s late (measured: two schedulers, one SIGSTOPped in its commit).

        And once one ask has come back unanswered in an iteration, the other claims wait for
        the next: each claim asking in turn, a survivor that took six partitions waited six
        asks, 1.2 s, in every iteration, and its own partitions' jobs fired that late."""
        assert self.input is not None
        p = task.partition
        busy = any(t.phase is Phase.READY for t in self.tasks.values())
        if busy and self._offsets_ask_spent:
            return False
        task.offsets_asked_at = time.monotonic()
        requests_tp, acks_tp = (self.topics.requests, p), (self.topics.acks, p)
        try:
            found = self.input.committed(
                [requests_tp, acks_tp], OFFSETS_ASK_S if busy else OFFSETS_WAIT_S
            )
            requests, acks = found[requests_tp], found[acks_tp]
        except BrokerError as exc:
            self._offsets_ask_spent = busy
            self._claim_failed(task, "cannot read committed offsets yet", exc)
            return False
        task.requests_committed = requests if requests >= 0 else None
        task.acks_committed = acks if acks >= 0 else None
        task.offsets_read = True
        return True

    def _claim_failed(self, task: PartitionTask, what: str, exc: BrokerError) -> None:
        """Keep the time a claim has been failing, counted only while a bootstrap server
        accepts connections (a claim waiting out an outage is not stuck, and a client replaced
        then could not tell the broker it leaves), and log it (a line per 5 s at most)."""
        now = time.monotonic()
        if task.claim_failing_since is None or not self._kafka_reachable():
            task.claim_failing_since = now
        times = self._claim_lines.due()
        if times:
            log.warning(
                what,
                extra={
                    "partition": task.partition,
                    "error": str(exc),
                    "failing_s": round(now - task.claim_failing_since, 1),
                    "times": times,  # failures of claims this line stands for
                },
            )

    def stuck_claim(self) -> str | None:
        """Why the partitions must be given up with every client, or None: a claim has failed
        to read the group's committed offsets or to rewind its input for
        ``Settings.scheduler_claim_stall_s`` with Kafka reachable.

        Both are asks of the group consumer, retried every iteration, so the loop goes on
        turning and neither its liveness nor the call watchdog sees a claim that never ends.
        Seen after broker restarts under commits: reading the offsets timed out for 300 s
        with the broker up, or the input could not be rewound (``Erroneous state``: the client
        no longer fetched the partition it was assigned) for 120 s; the partitions stayed
        "restoring", their jobs unfired. What is wrong is the client's own state, and the
        group consumer cannot be replaced on its own: the caller replaces every client and
        joins the group again (the broker is reachable, so the old member leaves)."""
        bound_s = self.settings.scheduler_claim_stall_s
        now = time.monotonic()
        for task in self.tasks.values():
            if task.phase is not Phase.RESTORING or task.claim_failing_since is None:
                continue
            failing_s = now - task.claim_failing_since
            if failing_s >= bound_s:
                self.stats.stuck_claims += 1
                log.error(
                    "a claim has been failing with Kafka reachable; replacing every client "
                    "and joining the group again",
                    extra={
                        "partition": task.partition,
                        "failing_s": round(failing_s, 1),
                        "setting": "JOBWHEEL_SCHEDULER_RESTORE_STALL_MS",
                    },
                )
                return f"the claim of partition {task.partition} failed for {failing_s:.0f} s"
        return None

    def _finish_restore(self, task: PartitionTask) -> None:
        assert self.changelog is not None and self.input is not None and self.acks is not None
        p = task.partition
        if task.rewind_input:
            try:
                self.input.seek(p, _start(task.requests_committed))
            except BrokerError as exc:
                # Not ready: the committed offsets are read and the changelog measured again
                # next iteration (a partition taken meanwhile is revoked at the next poll).
                self._claim_failed(task, "cannot rewind the input yet", exc)
                task.restore.reading = task.offsets_read = False
                return
        self.changelog.unassign(task.partition)
        self._stalled_since.pop(task.partition, None)
        task.claim_failing_since = None
        task.restore.reading = False
        if task.restore.fresh:
            rebuild_index(task.backend)
            task.restore.fresh = False
        raw = task.backend.jobs.get(EPOCH_KEY)
        task.epoch = (_EPOCH.unpack(raw)[0] if raw else 0) + 1
        task.state.put(EPOCH_KEY, _EPOCH.pack(task.epoch))  # changelogged by the next commit
        task.processor = SchedulerProcessor(
            p,
            task.state,
            fencing_token=task.epoch,
            retention_ms=self.settings.job_retention_ms,
            max_args_bytes=self.settings.max_args_bytes,
            max_active_runs=self.settings.scheduler_max_active_runs,
            max_record_bytes=self._record_limit,
            queues=self.queues,
        )
        self.acks.assign(p, _start(task.acks_committed))
        self.input.resume(p)
        task.committed_note = Progress(self.clock.now_ms(), task.processor.next_due_ms(), "")
        task.phase = Phase.READY
        restore_s = time.monotonic() - task.restore_started
        self.meters.restore.observe(restore_s * 1000)
        log.info(
            "partition ready",
            extra={
                "partition": p,
                "fencing_token": task.epoch,
                "restored_records": task.restore.applied,
                "restore_s": round(restore_s, 3),
                "next_due_ms": task.processor.next_due_ms(),
            },
        )
