"""The pool's events on the acks topic: STARTED, HEARTBEAT and the verdicts, sent until the broker
acknowledged them (a run's offset counts as done only then)."""

from __future__ import annotations

import functools
from typing import Any

from jobwheel.consumers.worker.pooling.core import (
    REPEAT_REASON,
    PoolCore,
    _AckRecord,
    _Execution,
    log,
)
from jobwheel.errors import BrokerError, DeliveryError
from jobwheel.schemas.models import Run, State, StatusEvent
from jobwheel.schemas.partitioning import key_for
from jobwheel.schemas.topics import DISPATCHED_HEADER, QUEUE_HEADER, STATE_HEADER


class Verdicts(PoolCore):
    def _send_verdict(self, ex: _Execution, record: _AckRecord) -> None:
        assert self._producer is not None
        self._unacked.add(ex)
        with self._lock:  # a revoke now waits for this verdict
            for tracker, offset in ex.offsets:
                tracker.own(offset)
        try:
            queued = self._producer.produce(
                *record, on_delivery=functools.partial(self._verdict_delivered, ex, record)
            )
        except BrokerError as exc:
            queued = False
            log.warning(
                "status event not queued; retrying",
                extra={"run_id": ex.run.run_id, "error": str(exc)},
            )
        if not queued:  # local queue full (or refused): try again shortly
            self._retry_later(ex, record)

    def _verdict_delivered(
        self, ex: _Execution, record: _AckRecord, error: DeliveryError | None
    ) -> None:
        """Delivery thread: the broker has the verdict, so the run's offsets are done."""
        if error is None:
            with self._lock:
                ex.acked = True
                for tracker, offset in ex.offsets:
                    tracker.mark_done(offset)
                self._lock.notify_all()
            self._unacked.discard(ex)
            self._acked.append(ex)
            return
        log.warning(
            "status event not delivered; retrying",
            extra={"run_id": ex.run.run_id, "attempt": ex.run.attempt, "error": str(error)},
        )
        self._threadsafe(self._retry_later, ex, record)

    def _retry_later(self, ex: _Execution, record: _AckRecord) -> None:
        """Send until acknowledged: the offset commit waits for the verdict, so giving up would
        stall the partition. Gives up only when the pool is closing (the record is then
        re-delivered to the next owner)."""
        if self._closing or self._loop is None:
            return
        self._loop.call_later(ex.redelivery.failed(), self._send_verdict, ex, record)

    def _reap(self) -> None:
        """Forget acknowledged executions and tell the middleware (after the broker ack)."""
        while self._acked:
            ex = self._acked.popleft()
            ran = ex.outcome is not None and ex.outcome.state is not State.STALE
            if ran:  # not for STALE: a forged or old record must not mark the real attempt done
                self._latest.finish(ex.run.run_id, ex.run.attempt, ex.run.fencing_token)
            if self._inflight.get(ex.key) is ex:
                del self._inflight[ex.key]
            if ran:
                assert ex.outcome is not None
                self._hook("after_process", ex.run, ex.outcome)

    def _send_started(self, ex: _Execution) -> None:
        ex.started_sent = True
        now = self._clock.now_ms()
        event = self._event(
            ex.run,
            State.STARTED,
            now_ms=ex.started_ms,  # when it started, not when this record is sent
            deadline_ms=now + ex.run.visibility_timeout_ms,
            reason=REPEAT_REASON if ex.repeat else None,
        )
        self._send_info(ex, event)

    def _send_info(self, ex: _Execution, event: StatusEvent) -> None:
        """STARTED and HEARTBEAT: sent once, never waited for (a lost one costs nothing the
        next heartbeat or the verdict does not make up for). Produced on the loop, before the
        run's verdict, so neither overtakes it."""
        assert self._producer is not None
        state = event.state.value
        run_id = ex.run.run_id

        def report(error: DeliveryError | None) -> None:
            if error is not None:
                log.warning(
                    "status event not delivered",
                    extra={"run_id": run_id, "state": state, "error": str(error)},
                )

        try:
            queued = self._producer.produce(*self._record(event, ex.run), on_delivery=report)
        except BrokerError as exc:
            log.warning(
                "status event not sent", extra={"run_id": run_id, "state": state, "error": str(exc)}
            )
            return
        if not queued:
            log.warning(
                "status event dropped: producer queue full",
                extra={"run_id": run_id, "state": state},
            )

    def _event(
        self,
        run: Run,
        state: State,
        *,
        suffix: str = "",
        now_ms: int | None = None,
        **fields: Any,
    ) -> StatusEvent:
        return StatusEvent(
            event_id=f"{run.run_id}:{run.attempt}:{state.value}{suffix}",
            job_id=run.job_id,
            state=state,
            event_time_ms=self._clock.now_ms() if now_ms is None else now_ms,
            source="worker",
            run_id=run.run_id,
            seq=run.seq,
            attempt=run.attempt,
            task=run.task,
            scheduled_time_ms=run.scheduled_time_ms,
            worker=self.worker_id,
            queue=self.queue,
            **fields,
        )

    def _record(self, event: StatusEvent, run: Run) -> _AckRecord:
        """The acks record of an event: keyed by job id (so it lands in the job's partition),
        its state in a header (so the scheduler skips what it does not need without decoding
        it), and when its run was dispatched (how far this partition's worker has got)."""
        headers = [
            (STATE_HEADER, event.state.value.encode()),
            (DISPATCHED_HEADER, str(run.dispatched_at_ms).encode()),
            (QUEUE_HEADER, self._queue_header),
        ]
        return self._acks_topic, key_for(event.job_id), self._codec.encode(event), headers
