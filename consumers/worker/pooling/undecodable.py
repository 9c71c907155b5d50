"""Runs records the worker cannot decode (a newer schema, damaged or foreign bytes).

Retrying bytes no reader here understands would block the partition for ever, so the record is
committed past; but not before it is kept and answered:

* its original bytes, key and headers go to the dead-letter topic, with the reason and where it
  was (the headers of :mod:`jobwheel.schemas.topics`, as the scheduler dead-letters its bad
  input), so an operator can see what arrived and which version wrote it;
* when the record names its run in the :data:`~jobwheel.schemas.topics.RUN_HEADER` the
  scheduler writes on every run, the worker acknowledges that attempt FAILED with the reason,
  retryable with the task's backoff: the scheduler's acks rule then retries the run (its next
  attempt is encoded again, and may reach a worker that reads it) or, out of attempts, ends it
  DEAD, at once rather than at the run's visibility deadline;
* a record that names no run (pure garbage, a scheduler older than the header) can only be
  dead-lettered, counted (``jobwheel_worker_undecodable_runs_total``) and logged: if it was a
  real dispatch, the scheduler's visibility deadline for the run, which on a partition no
  worker acknowledges anything on is bounded by ``JOBWHEEL_SCHEDULER_ACKS_SILENCE_MS``, ends
  the wait and retries it.

The offset counts as done only once the broker has acknowledged every record sent for it (the
copy and the verdict), as a run's offset waits for its verdict: a crash before that delivers
the record again to the partition's next owner, which answers it again (the scheduler ignores
a verdict of an attempt it has moved past; the same event id makes the repeated verdict a
duplicate to the status sink).
"""

from __future__ import annotations

import functools

from jobwheel.consumers.worker.backoff import DEFAULT_BACKOFF
from jobwheel.consumers.worker.kafka import Record
from jobwheel.consumers.worker.pooling.core import PoolCore, _AckRecord, _Undecodable, log
from jobwheel.consumers.worker.tracking import OffsetTracker
from jobwheel.errors import BrokerError, DeliveryError
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.schemas.topics import (
    DISPATCHED_HEADER,
    ERROR_HEADER,
    KIND_HEADER,
    QUEUE_HEADER,
    SIZE_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
    STATE_HEADER,
    UNDECODABLE_RUN_KIND,
    RunRef,
    read_run_header,
)

#: The ``error`` of the FAILED verdict of a run whose record did not decode starts with it.
UNDECODABLE_ERROR = "UndecodableRun"
#: Refusals of a dead-letter copy that no retry changes (see ``_copy_refused``).
_REFUSED_FOR_GOOD = frozenset({"TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"})
#: Reasons quote the decoder's message: bounded, as the scheduler bounds its own.
_MAX_REASON = 2000


class Undecodable(PoolCore):
    def _undecodable(self, tracker: OffsetTracker, record: Record, error: str) -> None:
        """Dead-letter ``record`` and, if it names its run, acknowledge that attempt FAILED;
        its offset is done once the broker has both (see the module doc)."""
        self.meters.undecodable += 1
        where = f"{self._runs_topic}:{record.partition}:{record.offset}"
        ref = read_run_header(record.key, record.headers)
        stale = (
            None
            if ref is None
            else self._latest.observe(ref.run_id, ref.attempt, ref.fencing_token)
        )
        if ref is None:
            answer = "none: the record names no run (the scheduler's deadline retries it)"
        elif stale is not None:
            answer = f"none: {stale}"
        else:
            answer = f"{State.FAILED.value} (attempt {ref.attempt})"
        log.error(
            "undecodable run record dead-lettered",
            extra={
                "topic": self._runs_topic,
                "partition": record.partition,
                "offset": record.offset,
                "error": error,
                "run_id": None if ref is None else ref.run_id,
                "answered": answer,
            },
        )
        reason = f"undecodable run record at {where}: {error}"[:_MAX_REASON]
        records = [self._dead_letter_copy(record, reason)]
        if ref is not None and stale is None:
            records.append(self._undecodable_verdict(ref, reason))
        item = _Undecodable(tracker, record.offset, len(records))
        self._unacked.add(item)
        with self._lock:  # a revoke now waits for these records
            tracker.own(record.offset)
        for out in records:
            self._send_undecodable(item, out)

    def _dead_letter_copy(self, record: Record, reason: str) -> _AckRecord:
        """The original record on the dead-letter topic (same key, so the job's partition):
        its own headers (the run it names), then the reason and where it was, which a
        reader takes over any header of the same name the record brought along."""
        headers = [
            *(record.headers or ()),
            (ERROR_HEADER, reason.encode("utf-8", "backslashreplace")),
            (KIND_HEADER, UNDECODABLE_RUN_KIND),
            (SOURCE_TOPIC_HEADER, self._runs_topic.encode()),
            (SOURCE_PARTITION_HEADER, str(record.partition).encode()),
            (SOURCE_OFFSET_HEADER, str(record.offset).encode()),
        ]
        return self._dead_letter_topic, record.key, record.value or b"", headers

    def _undecodable_verdict(self, ref: RunRef, reason: str) -> _AckRecord:
        """The FAILED verdict of the attempt ``ref`` names, as its execution's would be: the
        scheduler's acks rule retries it after the delay it carries (the task's backoff, or
        the default one for a task not registered here), or ends it DEAD when the attempt was
        the last, or this worker's task allows no more."""
        spec = self.registry.get(ref.task) if ref.task in self.registry else None
        delay: int | None
        if spec is not None and spec.max_attempts is not None and ref.attempt >= spec.max_attempts:
            delay = None
        else:
            delay = (spec.backoff if spec is not None else DEFAULT_BACKOFF).delay_ms(
                ref.attempt, self._rng
            )
        event = StatusEvent(
            event_id=f"{ref.run_id}:{ref.attempt}:{State.FAILED.value}",
            job_id=ref.job_id,
            state=State.FAILED,
            event_time_ms=self._clock.now_ms(),
            source="worker",
            run_id=ref.run_id,
            seq=ref.seq,
            attempt=ref.attempt,
            task=ref.task,
            scheduled_time_ms=ref.scheduled_time_ms,
            worker=self.worker_id,
            queue=self.queue,
            error=f"{UNDECODABLE_ERROR}: {reason}"[:_MAX_REASON],
            reason="the run record could not be decoded; dead-lettered, not executed",
            retry_delay_ms=delay,
        )
        headers = [
            (STATE_HEADER, State.FAILED.value.encode()),
            (DISPATCHED_HEADER, str(ref.dispatched_at_ms).encode()),
            (QUEUE_HEADER, self._queue_header),
        ]
        return self._acks_topic, ref.job_id.encode(), self._codec.encode(event), headers

    def _send_undecodable(self, item: _Undecodable, out: _AckRecord) -> None:
        """Send until the broker has it (as a verdict is sent): the commit waits for it."""
        assert self._producer is not None
        try:
            queued = self._producer.produce(
                *out, on_delivery=functools.partial(self._undecodable_delivered, item, out)
            )
        except BrokerError as exc:
            if self._copy_refused(item, out, exc):
                return
            queued = False
            log.warning(
                "undecodable run record's copy or verdict not queued; retrying",
                extra={"topic": out[0], "error": str(exc)},
            )
            out = _without_value(out, exc)
        if not queued:
            self._retry_undecodable(item, out)

    def _undecodable_delivered(
        self, item: _Undecodable, out: _AckRecord, error: DeliveryError | None
    ) -> None:
        """Delivery thread: once the broker has every record sent for it, the offset is done."""
        if error is None:
            self._undecodable_sent(item)
            return
        if self._copy_refused(item, out, error):
            return
        log.warning(
            "undecodable run record's copy or verdict not delivered; retrying",
            extra={"topic": out[0], "offset": item.offset, "error": str(error)},
        )
        self._threadsafe(self._retry_undecodable, item, _without_value(out, error))

    def _undecodable_sent(self, item: _Undecodable) -> None:
        """One record sent for it is settled; the last one makes its offset done."""
        with self._lock:
            item.waiting -= 1
            if item.waiting:
                return
            item.tracker.mark_done(item.offset)
            self._lock.notify_all()
        self._unacked.discard(item)

    def _copy_refused(self, item: _Undecodable, out: _AckRecord, error: BrokerError) -> bool:
        """A dead-letter copy the cluster does not let this worker write (an authorizer without
        a worker grant on the dead-letter topic) is given up, loudly: retrying it for ever
        would hold the partition's commit, and with it every run after it. The record stays
        on the runs topic (for its retention) where the log line says; its verdict still
        goes."""
        if out[0] != self._dead_letter_topic or error.code not in _REFUSED_FOR_GOOD:
            return False
        log.error(
            "undecodable run record not dead-lettered: the cluster refuses this worker's "
            "write to the dead-letter topic (grant it WRITE there to keep copies); the record "
            "is left on the runs topic",
            extra={
                "topic": self._runs_topic,
                "partition": item.tracker.partition,
                "offset": item.offset,
                "dead_letter_topic": out[0],
                "error": str(error),
            },
        )
        self._undecodable_sent(item)
        return True

    def _retry_undecodable(self, item: _Undecodable, out: _AckRecord) -> None:
        if self._closing or self._loop is None:
            return  # not done: delivered again to the partition's next owner
        self._loop.call_later(item.redelivery.failed(), self._send_undecodable, item, out)


def _without_value(out: _AckRecord, error: BrokerError) -> _AckRecord:
    """A dead-letter copy the producer or the broker refused as too large (the runs record
    fitted, the copy has more headers) goes again without its bytes, saying how many there
    were: sending it unchanged for ever would hold the partition's commit."""
    topic, key, value, headers = out
    if (
        error.code != "MSG_SIZE_TOO_LARGE"
        or not value
        or (KIND_HEADER, UNDECODABLE_RUN_KIND) not in headers
    ):
        return out
    return topic, key, b"", [*headers, (SIZE_HEADER, str(len(value)).encode())]
