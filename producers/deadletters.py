"""List and replay the dead-letter topic: the Kafka side of :mod:`jobwheel.schemas.deadletter`.

Reading: every partition of ``<prefix>.dead-letter`` from ``since`` (the broker's offset for
that time) up to the end offsets as they were when the read began, ``read_committed`` (the
scheduler writes dead letters in its transactions). Replaying: a dead run becomes a
``ReplayRun`` command, a rejected command its original bytes again with the header
``jobwheel.replayed-from``, both produced to the requests topic keyed by the job id (so the
partitioner is right, whatever the first producer did). Both are answered by the scheduler
with a status event that says it was a replay.

Replay is for after a fix, and twice is not better than once: a run is replayed only from its
latest dead letter (a replayed run that died again has a newer one), and ``already`` (the
status store's view, when it answers) skips runs that are no longer DEAD and commands the
scheduler has applied since.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobwheel.errors import BrokerError, DeliveryError, ValidationError
from jobwheel.schemas import deadletter as dl
from jobwheel.schemas.codec import Codec, default_codec

if TYPE_CHECKING:
    from jobwheel.producers.client import JobClient
    from jobwheel.settings import Settings

log = logging.getLogger(__name__)

#: Most records one listing returns (the newest are kept).
MAX_LIST = 10_000


@dataclass(frozen=True)
class Filter:
    """Which dead letters: all given conditions hold. ``reason`` is a case-insensitive part of
    the error text; ``kind`` one of :data:`jobwheel.schemas.deadletter.KINDS`."""

    since_ms: int | None = None
    task: str | None = None
    reason: str | None = None
    job_id: str | None = None
    kind: str | None = None
    limit: int = 1000

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in dl.KINDS:
            raise ValidationError("kind", f"{self.kind!r} is not one of {', '.join(dl.KINDS)}")
        if not 1 <= self.limit <= MAX_LIST:
            raise ValidationError("limit", f"must be between 1 and {MAX_LIST}")

    def matches(self, letter: dl.DeadLetter) -> bool:
        if self.since_ms is not None and letter.timestamp_ms < self.since_ms:
            return False
        if self.task is not None and letter.task != self.task:
            return False
        if self.job_id is not None and letter.job_id != self.job_id:
            return False
        if self.kind is not None and letter.kind != self.kind:
            return False
        return self.reason is None or self.reason.lower() in letter.error.lower()


def read_dead_letters(
    settings: Settings,
    flt: Filter,
    *,
    codec: Codec | None = None,
    timeout_s: float = 30.0,
) -> list[dl.DeadLetter]:
    """The dead letters matching ``flt``, oldest first (at most ``flt.limit``, the newest)."""
    from jobwheel.kafka.reader import BEGINNING, PartitionEnd, TopicReader

    codec = codec or default_codec(settings.schema_registry_url)
    topic = settings.topics.dead_letter
    reader = TopicReader(settings, "jobwheel.producers.deadletters", "dlq-reader", eof=True)
    deadline = time.monotonic() + timeout_s
    try:
        partitions = reader.partitions(topic, min(10.0, timeout_s))
        if partitions is None:
            raise BrokerError(
                f"dead-letter topic {topic} not found (run `jobwheel topics ensure`, or check "
                "JOBWHEEL_TOPIC_PREFIX)"
            )
        ends = {p: reader.end_offset(topic, p) for p in partitions}
        starts = {p: BEGINNING for p in partitions}
        if flt.since_ms is not None:
            starts = reader.offsets_at(topic, partitions, flt.since_ms, 10.0)
        waiting = {p for p, offset in starts.items() if offset < ends[p]}
        reader.assign({(topic, p): offset for p, offset in starts.items()})
        out: list[dl.DeadLetter] = []
        while waiting:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"reading {topic} did not reach its end within {timeout_s:.0f}s "
                    f"(partitions {sorted(waiting)})"
                )
            record = reader.poll(0.5)
            if record is None:
                continue
            p = record.partition
            if isinstance(record, PartitionEnd) or record.offset >= ends[p]:
                waiting.discard(p)
                continue
            if record.offset + 1 >= ends[p]:
                waiting.discard(p)
            letter = dl.parse(
                codec,
                partition=p,
                offset=record.offset,
                timestamp_ms=record.timestamp_ms,
                key=record.key,
                value=record.value,
                headers=record.headers,
                acks_topic=settings.topics.acks,
            )
            if flt.matches(letter):
                out.append(letter)
        out.sort(key=lambda d: (d.timestamp_ms, d.partition, d.offset))
        return out[-flt.limit :]
    finally:
        reader.close()


@dataclass(frozen=True)
class Outcome:
    """One dead letter's replay: sent (``command_id`` of what went to requests), or skipped."""

    letter: dl.DeadLetter
    sent: bool
    command_id: str | None = None
    skip: str | None = None
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.letter.as_dict(),
            "replayed": self.sent,
            "dry_run": self.dry_run,
            "command_id": self.command_id,
            "skipped": self.skip,
        }


def latest_per_run(letters: Iterable[dl.DeadLetter]) -> list[dl.DeadLetter]:
    """Each dead run once, its newest dead letter (a replayed run that died again has a newer
    one, with the attempts since); everything else as it is. Order kept."""
    latest: dict[str, dl.DeadLetter] = {}
    for letter in letters:
        if letter.run_id is not None:
            seen = latest.get(letter.run_id)
            if seen is None or (letter.run.attempt, letter.timestamp_ms) >= (  # type: ignore[union-attr]
                seen.run.attempt,  # type: ignore[union-attr]
                seen.timestamp_ms,
            ):
                latest[letter.run_id] = letter
    return [d for d in letters if d.run_id is None or latest[d.run_id] is d]


def replay_marks(
    letters: Iterable[dl.DeadLetter],
    already: Callable[[dl.DeadLetter], str | None] | None = None,
) -> dict[str, str]:
    """The dead letters (by ref) replayed already, and how that is known: a run's older dead
    letter was replayed, since a run dies again only after a replay (its newest letter is the
    one to replay now); otherwise ``already``, the status store's view (a run no longer DEAD, a
    command the scheduler has applied since). ``dlq list`` shows these, so a user does not
    replay, or puzzle over, what was dealt with."""
    letters = list(letters)
    newest = {d.run_id: d for d in latest_per_run(letters) if d.run_id is not None}
    marks: dict[str, str] = {}
    for letter in letters:
        if letter.run_id is not None and newest[letter.run_id] is not letter:
            marks[letter.ref] = (
                f"replayed already: the run died again, see {newest[letter.run_id].ref}"
            )
        elif already is not None and (why := already(letter)):
            marks[letter.ref] = why
    return marks


def replay(
    settings: Settings,
    letters: Iterable[dl.DeadLetter],
    *,
    client: JobClient,
    dry_run: bool = False,
    reason: str | None = None,
    already: Callable[[dl.DeadLetter], str | None] | None = None,
    codec: Codec | None = None,
) -> list[Outcome]:
    """Replay each letter (see the module doc); nothing is sent with ``dry_run``."""
    codec = codec or default_codec(settings.schema_registry_url)
    outcomes: list[Outcome] = []
    for letter in latest_per_run(list(letters)):
        command_id = uuid.uuid4().hex
        plan = dl.plan(
            letter,
            codec,
            command_id=command_id,
            now_ms=time.time_ns() // 1_000_000,
            max_args_bytes=settings.max_args_bytes,
            reason=reason,
        )
        skip = plan.skip or (already(letter) if already is not None else None)
        if skip is not None:
            outcomes.append(Outcome(letter, False, skip=skip, dry_run=dry_run))
            continue
        if plan.command is not None:
            sent_id = plan.command.command_id
        else:
            sent_id = letter.command.command_id if letter.command is not None else None
        if not dry_run:
            try:
                if plan.command is not None:
                    client.send(plan.command)
                else:
                    client.send_raw(
                        plan.key,
                        letter.value or b"",
                        [(dl.REPLAYED_FROM_HEADER, letter.ref.encode())],
                    )
            except (DeliveryError, ValidationError) as exc:
                outcomes.append(Outcome(letter, False, skip=f"not sent: {exc}"))
                continue
            log.info(
                "dead letter replayed",
                extra={"ref": letter.ref, "kind": letter.kind, "job_id": letter.job_id},
            )
        outcomes.append(Outcome(letter, True, command_id=sent_id, dry_run=dry_run))
    return outcomes
