"""The dead-letter topic's records (schemas/README.md, "Dead-letter records"), and what replaying
each kind means. Pure: records in, values and verdicts out; the Kafka plumbing that reads the
topic and produces the replays is :mod:`jobwheel.producers.deadletters`.

Kinds, told apart by the ``jobwheel.kind`` header and ``jobwheel.source.topic``:

- ``dead-run``: a run out of attempts (value = the encoded ``Run``). Replayed with a
  ``ReplayRun`` command (job_command.v3): the scheduler dispatches the same run again, its
  next attempt, and its DISPATCHED event says it is a replay. Replay after fixing the cause (the
  task's code, a missing task module on the workers, an outage it depended on).
- ``request``: a command the scheduler could not apply (original bytes and key). Replayed by
  producing the original bytes to the requests topic again, with the header
  ``jobwheel.replayed-from`` naming the dead-letter record; the scheduler's answer then says it
  was replayed. Only when the command would be accepted now: it is decoded and checked with the
  scheduler's own rules (as of its issue time, as the scheduler judges it) first. So commands
  rejected for transient reasons replay (a schema version the scheduler did not know yet, a
  scheduler error, a producer that used the wrong partitioner: a replay is keyed and partitioned
  correctly), and an invalid command does not: unchanged it would be rejected again, so fix it
  and submit it anew.
- ``undecodable-run``: a runs record a worker could not decode (original bytes, key and
  headers). Never replayed: the worker answered the run it names FAILED, and the scheduler
  retried it or ended it DEAD (a DEAD run has its own ``dead-run`` record to replay).
- ``ack``: a worker's event the scheduler could not read. Never replayed (an old verdict
  re-sent later could be taken for a new one).
- ``too-large``: only a reference (the record was too large to copy): nothing to replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from jobwheel.errors import JobwheelError, SchemaDecodeError, ValidationError
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.models import JobCommand, ReplayRun, Run, StatusEvent
from jobwheel.schemas.topics import (
    DEAD_RUN_KIND,
    ERROR_HEADER,
    KIND_HEADER,
    SIZE_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
    UNDECODABLE_RUN_KIND,
)
from jobwheel.schemas.validation import check_command, check_key

#: On a command produced again from the dead-letter topic: ``<dead-letter partition>:<offset>``
#: of the record it came from. The scheduler mentions it in the events the command causes.
REPLAYED_FROM_HEADER = "jobwheel.replayed-from"

DEAD_RUN = "dead-run"
REQUEST = "request"
ACK = "ack"
TOO_LARGE = "too-large"
UNDECODABLE_RUN = UNDECODABLE_RUN_KIND.decode()
KINDS = (DEAD_RUN, REQUEST, ACK, TOO_LARGE, UNDECODABLE_RUN)


@dataclass(frozen=True)
class DeadLetter:
    """One dead-letter record, read."""

    partition: int
    offset: int
    timestamp_ms: int
    kind: str
    job_id: str
    error: str
    #: where a bad record came from: (topic, partition, offset); None for dead runs
    source: tuple[str, int, int] | None = None
    run: Run | None = None
    command: JobCommand | None = None
    #: why the value could not be read (a bad request's bytes often cannot)
    undecodable: str | None = None
    key: bytes | None = None
    value: bytes | None = None
    size: int | None = None

    @property
    def ref(self) -> str:
        """``<partition>:<offset>`` on the dead-letter topic: the record's name."""
        return f"{self.partition}:{self.offset}"

    @property
    def task(self) -> str | None:
        if self.run is not None:
            return self.run.task
        body = getattr(self.command, "body", None)
        return getattr(body, "task", None)

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run is not None else None

    def describe(self) -> str:
        """What the record is, in a few words (the CLI's and the console's summary)."""
        if self.run is not None:
            return f"run {self.run.run_id} attempt {self.run.attempt} of task {self.run.task}"
        if self.command is not None:
            return f"{type(self.command.body).__name__} command {self.command.command_id}"
        if self.kind == TOO_LARGE:
            return f"a record of {self.size} bytes (not copied)"
        return "undecodable bytes"

    def as_dict(self) -> dict[str, object]:
        return {
            "ref": self.ref,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp_ms": self.timestamp_ms,
            "kind": self.kind,
            "job_id": self.job_id,
            "run_id": self.run_id,
            "task": self.task,
            "attempt": self.run.attempt if self.run is not None else None,
            "error": self.error,
            "source": None if self.source is None else ":".join(map(str, self.source)),
            "what": self.describe(),
        }


def _headers(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers or ():
        out[name] = (value or b"").decode("utf-8", "replace")
    return out


def parse(
    codec: Codec,
    *,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
    acks_topic: str,
) -> DeadLetter:
    """A dead-letter record as a :class:`DeadLetter`; never raises (a record that is not what
    its headers say is still listed, with ``undecodable`` saying why)."""
    h = _headers(headers)
    job_id = (key or b"").decode("utf-8", "replace")
    error = h.get(ERROR_HEADER, "")
    source = None
    if SOURCE_TOPIC_HEADER in h:
        try:
            source = (
                h[SOURCE_TOPIC_HEADER],
                int(h.get(SOURCE_PARTITION_HEADER, "-1")),
                int(h.get(SOURCE_OFFSET_HEADER, "-1")),
            )
        except ValueError:
            source = (h[SOURCE_TOPIC_HEADER], -1, -1)
    common = {
        "partition": partition,
        "offset": offset,
        "timestamp_ms": timestamp_ms,
        "job_id": job_id,
        "error": error,
        "source": source,
        "key": key,
        "value": value,
    }
    kind_header = h.get(KIND_HEADER)
    if kind_header == TOO_LARGE:
        size = h.get(SIZE_HEADER, "")
        return DeadLetter(kind=TOO_LARGE, size=int(size) if size.isdigit() else None, **common)
    if kind_header == UNDECODABLE_RUN:
        size = h.get(SIZE_HEADER, "")
        try:  # a newer reader may read what the worker could not
            run = codec.decode(value or b"")
            if not isinstance(run, Run):
                raise SchemaDecodeError(f"a {type(run).__name__}, not a Run")
        except SchemaDecodeError as exc:
            return DeadLetter(
                kind=UNDECODABLE_RUN,
                undecodable=str(exc),
                size=int(size) if size.isdigit() else None,
                **common,
            )
        return DeadLetter(kind=UNDECODABLE_RUN, run=run, **common)
    if kind_header == DEAD_RUN_KIND.decode():
        try:
            run = codec.decode(value or b"")
            if not isinstance(run, Run):
                raise SchemaDecodeError(f"a {type(run).__name__}, not a Run")
        except SchemaDecodeError as exc:
            return DeadLetter(kind=DEAD_RUN, undecodable=str(exc), **common)
        return DeadLetter(kind=DEAD_RUN, run=run, **common)
    kind = ACK if source is not None and source[0] == acks_topic else REQUEST
    try:
        command = codec.decode(value or b"")
    except SchemaDecodeError as exc:
        return DeadLetter(kind=kind, undecodable=str(exc), **common)
    if kind == REQUEST and isinstance(command, JobCommand):
        return DeadLetter(kind=kind, command=command, **common)
    return DeadLetter(kind=kind, undecodable=f"a {type(command).__name__}", **common)


@dataclass(frozen=True)
class Replay:
    """What replaying one record sends: a new command, or the original bytes again."""

    letter: DeadLetter
    #: the ReplayRun of a dead run (None for a request: ``value`` goes as it is)
    command: JobCommand | None = None
    #: why it is not replayed (None: it is)
    skip: str | None = None

    @property
    def key(self) -> bytes:
        return self.letter.job_id.encode("utf-8") if self.command else (self.letter.key or b"")


def plan(
    letter: DeadLetter,
    codec: Codec,
    *,
    command_id: str,
    now_ms: int,
    max_args_bytes: int,
    reason: str | None = None,
) -> Replay:
    """How ``letter`` would be replayed now, or why it would not (see the module doc)."""
    if letter.kind == TOO_LARGE:
        return Replay(letter, skip="only a reference is kept (the record was too large to copy)")
    if letter.kind == ACK:
        return Replay(letter, skip="a worker's event; acknowledgements are never replayed")
    if letter.kind == UNDECODABLE_RUN:
        return Replay(
            letter,
            skip="a run record no worker could decode; its run was answered FAILED and "
            "retried or ended DEAD by the scheduler (replay its dead-run record)",
        )
    if letter.kind == DEAD_RUN:
        run = letter.run
        if run is None:
            return Replay(letter, skip=f"its Run does not decode: {letter.undecodable}")
        body = ReplayRun(
            run_id=run.run_id,
            scheduled_time_ms=run.scheduled_time_ms,
            attempt=run.attempt,
            task=run.task,
            args_json=run.args_json,
            max_attempts=_spec_attempts(run),
            timeout_ms=run.timeout_ms,
            visibility_timeout_ms=run.visibility_timeout_ms,
            reason=reason,
            queue=run.queue,
        )
        command = JobCommand(command_id, run.job_id, now_ms, body)
        try:
            check_command(command, now_ms=now_ms, max_args_bytes=max_args_bytes)
        except ValidationError as exc:
            return Replay(letter, skip=f"cannot build its replay: {exc}")
        return Replay(letter, command=command)
    # a rejected command: replay only what the scheduler would accept now
    verdict = would_be_accepted(letter, codec, max_args_bytes=max_args_bytes)
    if verdict is not None:
        return Replay(letter, skip=f"would be rejected again ({verdict}); fix it and submit anew")
    return Replay(letter)


def _spec_attempts(run: Run) -> int:
    """The job's ``max_attempts`` as far as the Run shows it: the Run carries the spec's value
    plus the attempts its worker handed back or an earlier replay used, which can only make the
    replay's allowance larger (used only for a job the scheduler has forgotten)."""
    return max(1, min(run.max_attempts, 2**31 - 1))


def would_be_accepted(letter: DeadLetter, codec: Codec, *, max_args_bytes: int) -> str | None:
    """Why the scheduler would reject this bad request's bytes again, or None if it would now
    accept them: the same checks, in the same order, as the scheduler's (decode, the key,
    the command's rules as of its issue time)."""
    try:
        command = codec.decode(letter.value or b"")
    except SchemaDecodeError as exc:
        return f"undecodable: {exc}"
    if not isinstance(command, JobCommand):
        return f"a {type(command).__name__} is not a JobCommand"
    try:
        check_key(letter.key, command)
        check_command(command, now_ms=command.issued_at_ms, max_args_bytes=max_args_bytes)
    except ValidationError as exc:
        return f"invalid command: {exc}"
    except JobwheelError as exc:
        return str(exc)
    return None


def note_replay(events: list[StatusEvent], command_id: str, origin: str) -> list[StatusEvent]:
    """The events a replayed command caused directly (ids ``<command id>:<STATE>``), each with
    a reason saying it was replayed from the dead-letter topic, and from where."""
    prefix = f"{command_id}:"
    note = f"replayed from the dead-letter topic ({origin})"
    return [
        dataclasses.replace(e, reason=f"{note}: {e.reason}" if e.reason else note)
        if e.event_id.startswith(prefix)
        else e
        for e in events
    ]
