"""The per-job record the scheduler keeps in its ``jobs`` state store, its timers, and its
versioned encoding.

The record is everything the partition owner needs to decide what happens next: the job's spec,
where it is in its schedule, the runs it has in flight and the commands it has already applied
(so a command redelivered after a crash is not applied twice). It is written to the changelog on
every change, so it stays small: the spec, a few counters, the active runs and a bounded list of
recent command ids.

Timers are derived, not stored separately: :func:`timers_of` says which instants a record waits
for (its next fire, each active run's visibility deadline or retry time, its expiry). The timing
wheels are an index of those instants (:mod:`jobwheel.streams.state.partition`), rebuilt from the
records
after a restore; only the records go to the changelog. So the index can never disagree with the
state it indexes.

Encoding (version 2): one version byte, the record's timers in a small binary header (so a
restore can rebuild the index without parsing the rest), then the record as JSON::

    0x02 | u16 n | n x (u8 wheel, u64 due_ms, u16 tag length, tag UTF-8) | JSON

The JSON is written and read with orjson: a job's record is encoded on every change and decoded
on every look, three and two times in a one-off job's life, and the standard library's json
took a tenth of the scheduler's CPU per job.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Any

import orjson

from jobwheel.errors import StateError
from jobwheel.schemas.models import (
    DEFAULT_QUEUE,
    After,
    At,
    ConcurrencyPolicy,
    Cron,
    Every,
    Now,
    ScheduleJob,
    Trigger,
    spec_document,
)

STATE_VERSION = 2
RECENT_COMMANDS = 16
#: Dead runs a job record remembers having replayed (see :attr:`JobRecord.replays`).
RECENT_REPLAYS = 64

#: Which wheel a timer lives in. Fires, retries and expiry are due by the wall clock;
#: visibility deadlines are due only once the acknowledgements before them have been read.
TIMERS = 0
DEADLINES = 1

FIRE = "fire"
EXPIRE = "expire"
VISIBILITY = "vis"
RETRY = "retry"

#: A record's timers as its header stores them (:func:`timer_entries`, :func:`peek_timers`):
#: ``(wheel, due_ms, tag bytes)``.
Timers = list[tuple[int, int, bytes]]

_HEAD = struct.Struct(">BH")
_TIMER = struct.Struct(">BQH")


class JobStatus(enum.StrEnum):
    """Where a job is in its life (the job state table in the README). ``ACTIVE`` is what users
    see as SCHEDULED: the value is kept because records in changelogs already carry it."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
    DEAD = "DEAD"  # nothing left to run, and its last run ended DEAD

    @property
    def shown(self) -> str:
        """The job state as status events, the store and the CLI name it."""
        return "SCHEDULED" if self is JobStatus.ACTIVE else self.value


class RunPhase(enum.StrEnum):
    DISPATCHED = "DISPATCHED"  # on the runs topic, waiting for the worker's verdict
    RETRY_WAIT = "RETRY_WAIT"  # failed; the next attempt waits for its backoff


@dataclass(slots=True)
class ActiveRun:
    """A run that is not finished. ``attempt`` is the latest attempt dispatched (or, in
    RETRY_WAIT, the attempt that failed). ``due_ms`` is when the scheduler looks at it next:
    the visibility deadline of a DISPATCHED attempt, the retry time in RETRY_WAIT."""

    run_id: str
    scheduled_ms: int
    attempt: int
    seq: int
    phase: RunPhase
    due_ms: int
    handbacks: int = 0  # attempts handed back by stopping workers: not counted as failures
    #: Attempts the run had used before a dead-letter replay gave it ``max_attempts`` more.
    base: int = 0
    dispatched_ms: int = 0  # when the current attempt was dispatched
    #: The visibility deadline the dispatch or the run's acks set, while ``due_ms`` is later
    #: because the acks of the run's own queue had not reached it (0: ``due_ms`` is it).
    deadline_ms: int = 0
    #: The worker said this attempt started (STARTED or HEARTBEAT): it was reached, even when
    #: the partition's furthest report is of a run dispatched in the same millisecond.
    reported: bool = False

    @property
    def limit_extra(self) -> int:
        """Attempts beyond the spec's ``max_attempts`` this run may use."""
        return self.handbacks + self.base


@dataclass(slots=True)
class JobRecord:
    job_id: str
    spec: ScheduleJob
    issued_at_ms: int
    status: JobStatus = JobStatus.ACTIVE
    seq: int = 0
    next_fire_ms: int | None = None
    last_error: str | None = None
    #: How the latest run of the job to end, ended (SUCCEEDED, DEAD, MISSED, SKIPPED): a job
    #: with nothing left to run is DEAD when it is DEAD, else COMPLETED.
    last_outcome: str | None = None
    #: A COMPLETED, DEAD or CANCELLED job's record is deleted at this instant (retention).
    expires_at_ms: int | None = None
    active: dict[str, ActiveRun] = field(default_factory=dict)
    recent_commands: list[str] = field(default_factory=list)
    #: The issue times of the job's latest manual triggers, and the latest one forgotten
    #: since: a trigger's run is named by its issue time (``<job id>@trigger-<ms>``), so a
    #: second trigger issued in the same millisecond must not run under the same run id
    #: (its events would merge with the first run's).
    recent_triggers: list[int] = field(default_factory=list)
    trigger_floor: int | None = None
    #: The runs the job's latest dead-letter replays dispatched: run id -> (scheduled time,
    #: the attempt the replay dispatched), oldest first, at most :data:`RECENT_REPLAYS`; and
    #: the latest scheduled time of a replayed run forgotten since. A replay names the run and
    #: the attempt it died at and dispatches the next one: a second replay of the same dead
    #: letter, after the first one's run ended, would dispatch that attempt again (same run
    #: id and attempt, its events merging with the first replay's in the status store).
    replays: dict[str, tuple[int, int]] = field(default_factory=dict)
    replay_floor: int | None = None
    #: The spec's JSON document as last encoded, with the spec it was encoded from (not
    #: stored: see :func:`spec_json`).
    encoded_spec: tuple[ScheduleJob, str] | None = field(default=None, compare=False, repr=False)

    def remember(self, command_id: str) -> None:
        self.recent_commands.append(command_id)
        del self.recent_commands[:-RECENT_COMMANDS]

    def remember_trigger(self, issued_at_ms: int) -> None:
        self.recent_triggers.append(issued_at_ms)
        if len(self.recent_triggers) > RECENT_COMMANDS:
            forgotten = self.recent_triggers.pop(0)
            if self.trigger_floor is None or forgotten > self.trigger_floor:
                self.trigger_floor = forgotten

    def remember_replay(self, run_id: str, scheduled_ms: int, attempt: int) -> None:
        """Note that a replay dispatched ``attempt`` of ``run_id`` (the latest replay goes to
        the end; the oldest is forgotten past :data:`RECENT_REPLAYS`, its scheduled time
        kept as the floor)."""
        self.replays.pop(run_id, None)
        self.replays[run_id] = (scheduled_ms, attempt)
        while len(self.replays) > RECENT_REPLAYS:
            forgotten = next(iter(self.replays))
            at, _ = self.replays.pop(forgotten)
            if self.replay_floor is None or at > self.replay_floor:
                self.replay_floor = at

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


# --- timers -------------------------------------------------------------------------------


def run_tag(run: ActiveRun) -> str:
    """The timer tag of an active run: which attempt's deadline, or which attempt is next."""
    if run.phase is RunPhase.RETRY_WAIT:
        return f"{RETRY}|{run.attempt + 1}|{run.run_id}"
    return f"{VISIBILITY}|{run.attempt}|{run.run_id}"


def parse_tag(tag: str) -> tuple[str, int, str]:
    """``(kind, attempt, run_id)`` of a timer tag (attempt 0 and no run for fire/expire)."""
    if tag in (FIRE, EXPIRE):
        return tag, 0, ""
    kind, attempt, run_id = tag.split("|", 2)
    return kind, int(attempt), run_id


def timers_of(job: JobRecord) -> list[tuple[int, int, str]]:
    """Every ``(wheel, due_ms, tag)`` the record waits for."""
    out: list[tuple[int, int, str]] = []
    if job.status is JobStatus.ACTIVE and job.next_fire_ms is not None:
        out.append((TIMERS, job.next_fire_ms, FIRE))
    for run in job.active.values():
        wheel = DEADLINES if run.phase is RunPhase.DISPATCHED else TIMERS
        out.append((wheel, run.due_ms, run_tag(run)))
    if job.expires_at_ms is not None:
        out.append((TIMERS, job.expires_at_ms, EXPIRE))
    return out


def peek_timers(data: bytes | None) -> Timers:
    """The timers of an encoded record, from its header only: ``(wheel, due_ms, tag bytes)``.

    Cheap (no JSON), so restoring a million records does not parse a million documents. A
    record this build cannot read has no timers (it is reported when it is loaded).
    """
    if not data or data[0] != STATE_VERSION:
        return []
    try:
        _, count = _HEAD.unpack_from(data, 0)
        pos = _HEAD.size
        out = []
        for _ in range(count):
            wheel, due, size = _TIMER.unpack_from(data, pos)
            pos += _TIMER.size
            out.append((wheel, due, bytes(data[pos : pos + size])))
            pos += size
        return out
    except struct.error:
        return []


# --- encoding -----------------------------------------------------------------------------

_TRIGGERS: dict[str, type] = {"Now": Now, "At": At, "After": After, "Every": Every, "Cron": Cron}


def _trigger_from_dict(data: dict[str, Any]) -> Trigger:
    kind = _TRIGGERS[data.pop("type")]
    return kind(**data)  # type: ignore[no-any-return]


def timer_entries(job: JobRecord) -> Timers:
    """:func:`timers_of` in the form the record's header stores (and :func:`peek_timers`
    reads): ``(wheel, due_ms, tag bytes)``."""
    return [(wheel, due, tag.encode()) for wheel, due, tag in timers_of(job)]


def _header(timers: Timers) -> bytes:
    parts = [_HEAD.pack(STATE_VERSION, len(timers))]
    for wheel, due, tag in timers:
        parts.append(_TIMER.pack(wheel, due, len(tag)))
        parts.append(tag)
    return b"".join(parts)


def spec_json(job: JobRecord) -> str:
    """The job's spec as the JSON document a SCHEDULED event carries (one definition of its
    shape, :func:`~jobwheel.schemas.models.spec_document`). The spec never changes in place
    (it is frozen; a new schedule replaces it), and a record is encoded on every change: the
    document is made once per spec, not once per write. Kept as text: the bytes orjson
    returns hold a 4 KiB buffer whatever their length, which the record cache held for every
    record (16 MiB per 4,096)."""
    cached = job.encoded_spec
    if cached is not None and cached[0] is job.spec:
        return cached[1]
    text = orjson.dumps(spec_document(job.spec)).decode()
    job.encoded_spec = (job.spec, text)
    return text


def encode_job(job: JobRecord, timers: Timers | None = None) -> bytes:
    """The record's bytes; ``timers`` are its :func:`timer_entries` when the caller has
    them already."""
    body = orjson.dumps(
        {
            "job_id": job.job_id,
            "spec": orjson.Fragment(spec_json(job)),
            "issued_at_ms": job.issued_at_ms,
            "status": job.status.value,
            "seq": job.seq,
            "next_fire_ms": job.next_fire_ms,
            "last_error": job.last_error,
            "last_outcome": job.last_outcome,
            "expires_at_ms": job.expires_at_ms,
            "active": [
                [
                    r.run_id,
                    r.scheduled_ms,
                    r.attempt,
                    r.seq,
                    r.phase.value,
                    r.due_ms,
                    r.handbacks,
                    r.base,
                    r.dispatched_ms,
                    r.deadline_ms,
                    r.reported,
                ]
                for r in job.active.values()
            ],
            "recent": job.recent_commands,
            "triggers": job.recent_triggers,
            "trigger_floor": job.trigger_floor,
            "replays": [[run, at, attempt] for run, (at, attempt) in job.replays.items()],
            "replay_floor": job.replay_floor,
        }
    )
    return _header(timer_entries(job) if timers is None else timers) + body


def decode_job(data: bytes) -> JobRecord:
    if not data or data[0] != STATE_VERSION:
        version = data[0] if data else None
        raise StateError(
            f"job state version {version!r} is not supported (this scheduler reads version "
            f"{STATE_VERSION}); upgrade the scheduler before it restores this state"
        )
    try:
        _, count = _HEAD.unpack_from(data, 0)
        pos = _HEAD.size
        for _ in range(count):
            pos += _TIMER.size + _TIMER.unpack_from(data, pos)[2]
        raw = orjson.loads(data[pos:])
        s = raw["spec"]
        spec = ScheduleJob(
            task=s["task"],
            trigger=_trigger_from_dict(s["trigger"]),
            args_json=s["args_json"],
            max_attempts=s["max_attempts"],
            timeout_ms=s["timeout_ms"],
            visibility_timeout_ms=s["visibility_timeout_ms"],
            starting_deadline_ms=s["starting_deadline_ms"],
            concurrency_policy=ConcurrencyPolicy(s["concurrency_policy"]),
            idempotency_key=s["idempotency_key"],
            queue=s.get("queue", DEFAULT_QUEUE),  # absent in records written before queues
        )
        active = {
            # r[7] (base), r[8] (dispatched_ms), r[9] (deadline_ms), r[10] (reported) are
            # absent in records written before them
            r[0]: ActiveRun(r[0], r[1], r[2], r[3], RunPhase(r[4]), r[5], r[6], *r[7:11])
            for r in raw["active"]
        }
        return JobRecord(
            job_id=raw["job_id"],
            spec=spec,
            issued_at_ms=raw["issued_at_ms"],
            status=JobStatus(raw["status"]),
            seq=raw["seq"],
            next_fire_ms=raw["next_fire_ms"],
            last_error=raw["last_error"],
            last_outcome=raw.get("last_outcome"),  # absent in records written before it
            expires_at_ms=raw["expires_at_ms"],
            active=active,
            recent_commands=list(raw["recent"]),
            # absent in records written before them
            recent_triggers=list(raw.get("triggers") or ()),
            trigger_floor=raw.get("trigger_floor"),
            replays={r[0]: (r[1], r[2]) for r in raw.get("replays") or ()},
            replay_floor=raw.get("replay_floor"),
        )
    except (
        orjson.JSONDecodeError,
        ValueError,
        KeyError,
        TypeError,
        IndexError,
        struct.error,
    ) as exc:
        raise StateError(f"job state is corrupt ({type(exc).__name__}: {exc})") from exc
