"""Waiting for a one-off job's result (``JobClient.wait``), read from Kafka itself.

The outcome is on the topics already: the scheduler's job-level event on ``<prefix>.status``
(COMPLETED, DEAD, CANCELLED; a REJECTED answer to the ScheduleJob) and the worker's SUCCEEDED,
which carries the task's return value as ``result_json``, on ``<prefix>.acks``. Both are keyed
by the job id, so one partition of each holds everything about the job (the co-partitioning
rule). Reading them needs nothing but the Kafka access the client already has: no status API,
no ClickHouse, and it works in a deployment that runs neither (the status API serves the same
result at ``GET /jobs/{id}``, for the humans).

Where to start reading: from just before the job was scheduled when this client scheduled it
(it remembers when, and the ScheduleJob's command id, so an older job with the same id cannot
answer), else from ``since`` (default: an hour ago). Reading is ``read_committed``; only the
job's key is decoded.

:class:`Outcome` is the pure part: it takes decoded events in topic order and says when the
job has finished, and how.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobwheel.errors import JobFailedError, SchemaDecodeError, WaitTimeoutError
from jobwheel.schemas.codec import Codec, default_codec
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.schemas.partitioning import partition_for
from jobwheel.schemas.topics import STATE_HEADER

if TYPE_CHECKING:
    from jobwheel.kafka.consumer import Record
    from jobwheel.kafka.reader import TopicReader
    from jobwheel.settings import Settings

log = logging.getLogger(__name__)

#: How far before the scheduling command reading starts (producer and broker clocks differ).
CLOCK_MARGIN_MS = 60_000
DEFAULT_LOOKBACK_MS = 3_600_000
#: Worker events that say nothing about the result: skipped by their header, not decoded.
_SKIPPED = {b"STARTED", b"HEARTBEAT", b"STALE"}


@dataclass
class Outcome:
    """What the events seen so far say about one job (pure; fed in topic order)."""

    job_id: str
    #: the ScheduleJob whose job we wait for: events before its SCHEDULED are an older job's
    command_id: str | None = None
    started_seq: int | None = None
    final: StatusEvent | None = None
    results: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    missed: bool = False
    #: events read before the job's SCHEDULED (the acks and status partitions are read side by
    #: side, so a worker's SUCCEEDED can arrive before the scheduler's SCHEDULED)
    early: list[StatusEvent] = field(default_factory=list)

    def feed(self, event: StatusEvent) -> None:
        if event.job_id != self.job_id:
            return
        if self.command_id is not None:
            if event.event_id == f"{self.command_id}:SCHEDULED":
                self.started_seq = event.seq
                self.final = None
                self.results.clear()
                self.errors.clear()
                self.missed = False
                early, self.early = self.early, []
                for seen in early:
                    self.feed(seen)
                return
            if event.event_id == f"{self.command_id}:REJECTED":
                self.final = event
                return
            if self.started_seq is None:
                self.early.append(event)
                return
            if event.seq < self.started_seq:
                return  # an older job with this id
        if event.run_id is not None:
            if event.state is State.SUCCEEDED:
                seen = self.results.get(event.run_id)
                if seen is None or event.seq >= seen[0]:
                    self.results[event.run_id] = (event.seq, event.result_json)
            elif event.error and event.state in (State.FAILED, State.DEAD, State.RETRYING):
                self.errors[event.run_id] = event.error
            elif event.state is State.MISSED:
                self.missed = True
            return
        if event.state in (State.COMPLETED, State.DEAD, State.CANCELLED):
            self.final = event
        elif event.state in (State.SCHEDULED, State.RESUMED, State.PAUSED):
            self.final = None  # scheduled again (same id) or paused and resumed: not over

    @property
    def done(self) -> bool:
        return self.final is not None

    def result(self) -> Any:
        """The task's return value (parsed JSON), or :class:`JobFailedError`."""
        final = self.final
        assert final is not None
        if final.state is State.COMPLETED and self.results:
            _, text = max(self.results.values(), key=lambda r: r[0])
            return None if text is None else json.loads(text)
        if final.state is State.COMPLETED and not self.missed:
            return None  # completed without a run result (a task that returned nothing)
        state = "MISSED" if final.state is State.COMPLETED else final.state.value
        error = next(reversed(self.errors.values()), None) if self.errors else None
        raise JobFailedError(self.job_id, state, final.reason, error)


def wait_for_result(
    settings: Settings,
    job_id: str,
    timeout_s: float,
    *,
    since_ms: int | None = None,
    command_id: str | None = None,
    codec: Codec | None = None,
) -> Any:
    """Block until the job has finished; its result, or :class:`JobFailedError`, or
    :class:`WaitTimeoutError` after ``timeout_s``."""
    from jobwheel.kafka.consumer import Record
    from jobwheel.kafka.reader import TopicReader

    codec = codec or default_codec(settings.schema_registry_url)
    topics = settings.topics
    key = job_id.encode("utf-8")
    now = time.time_ns() // 1_000_000
    start = (now - DEFAULT_LOOKBACK_MS) if since_ms is None else since_ms - CLOCK_MARGIN_MS
    outcome = Outcome(job_id, command_id=command_id)
    reader = TopicReader(settings, "jobwheel.producers.results", "wait")
    deadline = time.monotonic() + timeout_s
    try:
        lookup_s = min(10.0, max(1.0, timeout_s))
        p = partition_for(job_id, _partition_count(reader, settings, lookup_s))
        next_offset = {
            t: reader.offsets_at(t, [p], start, lookup_s)[p] for t in (topics.status, topics.acks)
        }
        reader.assign({(t, p): offset for t, offset in next_offset.items()})
        while True:
            record = reader.poll(max(0.0, min(0.5, deadline - time.monotonic())))
            if isinstance(record, Record):
                next_offset[record.topic] = record.offset + 1
                if record.key == key or record.key is None:  # None: a StatusBatch
                    _feed(outcome, codec, record)
            if outcome.done and next_offset[topics.acks] >= reader.end_offset(topics.acks, p):
                # The scheduler's COMPLETED follows the worker's SUCCEEDED, which may still be
                # unread when the COMPLETED arrives: read the acks partition to its end first.
                return outcome.result()
            if time.monotonic() >= deadline:
                unanswered = outcome.command_id is not None and outcome.started_seq is None
                raise WaitTimeoutError(
                    f"job {job_id} has not finished within {timeout_s:g}s"
                    + (
                        " (its scheduling was never answered: is a scheduler running?)"
                        if unanswered
                        else ""
                    )
                )
    finally:
        reader.close()


def _partition_count(reader: TopicReader, settings: Settings, timeout_s: float) -> int:
    """How many partitions the job's topics have: the status topic's own count, which is the
    one the producer's partitioner used for the command and the scheduler uses for the job.
    ``JOBWHEEL_PARTITIONS`` only when the broker does not say (a missing topic): a client
    left on the default 12 against a deployment made with 4 would otherwise read the wrong
    partition and wait until its timeout for an answer that came long before."""
    status = settings.topics.status
    found = reader.partitions(status, timeout_s)
    if not found:
        return settings.partitions
    if len(found) != settings.partitions:
        log.warning(
            "the topics have another partition count than this client's JOBWHEEL_PARTITIONS; "
            "using the topics'",
            extra={
                "topic": status,
                "partitions": len(found),
                "jobwheel_partitions": settings.partitions,
                "fix": f"set JOBWHEEL_PARTITIONS={len(found)} where this client runs",
            },
        )
    return len(found)


def _feed(outcome: Outcome, codec: Codec, record: Record) -> None:
    if any(name == STATE_HEADER and value in _SKIPPED for name, value in record.headers or ()):
        return
    value = record.value or b""
    try:
        items = codec.batch_items(value) or (value,)
    except SchemaDecodeError:
        return  # not ours to judge: the scheduler dead-letters what it cannot read
    for item in items:
        try:
            event = codec.decode(item)
        except SchemaDecodeError:
            continue
        if isinstance(event, StatusEvent) and event.job_id == outcome.job_id:
            outcome.feed(event)
