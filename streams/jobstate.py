"""The per-job record the scheduler keeps in its ``jobs`` state store, and its versioned encoding.

The record is everything the partition owner needs to decide what happens next: the job's spec,
where it is in its schedule, the runs it has in flight and the commands it has already applied
(so a command redelivered after a crash is not applied twice). It is written to the changelog on
every change, so it stays small: the spec, a few counters, the active runs and a bounded list of
recent command ids.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from jobwheel.errors import StateError
from schemas.models import (
    After,
    At,
    ConcurrencyPolicy,
    Cron,
    Every,
    Now,
    ScheduleJob,
    Trigger,
)

STATE_VERSION = 1
RECENT_COMMANDS = 16


class JobStatus(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"


class RunPhase(enum.StrEnum):
    DISPATCHED = "DISPATCHED"  # on the runs topic, waiting for the worker's verdict
    RETRY_WAIT = "RETRY_WAIT"  # failed; the next attempt waits for its backoff in the wheel


@dataclass(slots=True)
class ActiveRun:
    """A run that is not finished. ``attempt`` is the latest attempt dispatched (or, in
    RETRY_WAIT, the attempt that failed); ``wheel_due_ms`` is where its wheel entry sits, so it
    can be removed without a scan."""

    run_id: str
    scheduled_ms: int
    attempt: int
    seq: int
    phase: RunPhase
    deadline_ms: int
    wheel_due_ms: int
    handbacks: int = 0  # attempts handed back by stopping workers: not counted as failures


@dataclass(slots=True)
class JobRecord:
    job_id: str
    spec: ScheduleJob
    issued_at_ms: int
    status: JobStatus = JobStatus.ACTIVE
    seq: int = 0
    run_count: int = 0
    next_fire_ms: int | None = None
    last_error: str | None = None
    active: dict[str, ActiveRun] = field(default_factory=dict)
    recent_commands: list[str] = field(default_factory=list)

    def remember(self, command_id: str) -> None:
        self.recent_commands.append(command_id)
        del self.recent_commands[:-RECENT_COMMANDS]

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


# --- encoding -----------------------------------------------------------------------------

_TRIGGERS: dict[str, type] = {"Now": Now, "At": At, "After": After, "Every": Every, "Cron": Cron}


def _trigger_to_dict(trigger: Trigger) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(trigger).__name__}
    for name in trigger.__slots__:  # type: ignore[union-attr]
        out[name] = getattr(trigger, name)
    return out


def _trigger_from_dict(data: dict[str, Any]) -> Trigger:
    kind = _TRIGGERS[data.pop("type")]
    return kind(**data)  # type: ignore[no-any-return]


def encode_job(job: JobRecord) -> bytes:
    spec = job.spec
    return json.dumps(
        {
            "v": STATE_VERSION,
            "job_id": job.job_id,
            "spec": {
                "task": spec.task,
                "trigger": _trigger_to_dict(spec.trigger),
                "args_json": spec.args_json,
                "max_attempts": spec.max_attempts,
                "timeout_ms": spec.timeout_ms,
                "visibility_timeout_ms": spec.visibility_timeout_ms,
                "starting_deadline_ms": spec.starting_deadline_ms,
                "concurrency_policy": spec.concurrency_policy.value,
                "idempotency_key": spec.idempotency_key,
            },
            "issued_at_ms": job.issued_at_ms,
            "status": job.status.value,
            "seq": job.seq,
            "run_count": job.run_count,
            "next_fire_ms": job.next_fire_ms,
            "last_error": job.last_error,
            "active": [
                [
                    r.run_id,
                    r.scheduled_ms,
                    r.attempt,
                    r.seq,
                    r.phase.value,
                    r.deadline_ms,
                    r.wheel_due_ms,
                    r.handbacks,
                ]
                for r in job.active.values()
            ],
            "recent": job.recent_commands,
        },
        separators=(",", ":"),
    ).encode()


def decode_job(data: bytes) -> JobRecord:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise StateError(f"job state is not JSON ({exc}); the changelog record is corrupt") from exc
    version = raw.get("v")
    if version != STATE_VERSION:
        raise StateError(
            f"job state version {version!r} is not supported (this scheduler reads version "
            f"{STATE_VERSION}); upgrade the scheduler before it restores this state"
        )
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
    )
    active = {
        r[0]: ActiveRun(r[0], r[1], r[2], r[3], RunPhase(r[4]), r[5], r[6], r[7])
        for r in raw["active"]
    }
    return JobRecord(
        job_id=raw["job_id"],
        spec=spec,
        issued_at_ms=raw["issued_at_ms"],
        status=JobStatus(raw["status"]),
        seq=raw["seq"],
        run_count=raw["run_count"],
        next_fire_ms=raw["next_fire_ms"],
        last_error=raw["last_error"],
        active=active,
        recent_commands=list(raw["recent"]),
    )
