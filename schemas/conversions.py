"""jobwheel's models <-> the dicts fastavro writes and reads, per record kind (the codec's
conversions; the framing is :mod:`jobwheel.schemas.codec`)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobwheel.errors import ValidationError
from jobwheel.schemas.catalogue import NAMESPACE
from jobwheel.schemas.models import (
    After,
    At,
    CancelJob,
    ConcurrencyPolicy,
    Cron,
    Every,
    JobCommand,
    Now,
    PauseJob,
    ReplayRun,
    ResumeJob,
    Run,
    ScheduleJob,
    State,
    StatusBatch,
    StatusEvent,
    TriggerJob,
)


def _name(short: str) -> str:
    return f"{NAMESPACE}.{short}"


_TRIGGER_TO: dict[type, Callable[[Any], tuple[str, dict[str, Any]]]] = {
    Now: lambda t: (_name("Now"), {}),
    At: lambda t: (_name("At"), {"at_ms": t.at_ms}),
    After: lambda t: (_name("After"), {"delay_ms": t.delay_ms}),
    Every: lambda t: (_name("Every"), {"interval_ms": t.interval_ms, "start_at_ms": t.start_at_ms}),
    Cron: lambda t: (_name("Cron"), {"expression": t.expression, "timezone": t.timezone}),
}

_TRIGGER_FROM: dict[str, Callable[[dict[str, Any]], Any]] = {
    _name("Now"): lambda d: Now(),
    _name("At"): lambda d: At(d["at_ms"]),
    _name("After"): lambda d: After(d["delay_ms"]),
    _name("Every"): lambda d: Every(d["interval_ms"], d["start_at_ms"]),
    _name("Cron"): lambda d: Cron(d["expression"], d["timezone"]),
}


def _schedule_to(b: ScheduleJob) -> tuple[str, dict[str, Any]]:
    trigger = _TRIGGER_TO.get(type(b.trigger))
    if trigger is None:
        raise ValidationError("trigger", f"unsupported trigger {b.trigger!r}")
    return (
        _name("ScheduleJob"),
        {
            "task": b.task,
            "args_json": b.args_json,
            "trigger": trigger(b.trigger),
            "max_attempts": b.max_attempts,
            "timeout_ms": b.timeout_ms,
            "visibility_timeout_ms": b.visibility_timeout_ms,
            "starting_deadline_ms": b.starting_deadline_ms,
            "concurrency_policy": str(b.concurrency_policy),
            "idempotency_key": b.idempotency_key,
            "queue": b.queue,
        },
    )


def _schedule_from(d: dict[str, Any]) -> ScheduleJob:
    name, trigger = d["trigger"]
    return ScheduleJob(
        task=d["task"],
        trigger=_TRIGGER_FROM[name](trigger),
        args_json=d["args_json"],
        max_attempts=d["max_attempts"],
        timeout_ms=d["timeout_ms"],
        visibility_timeout_ms=d["visibility_timeout_ms"],
        starting_deadline_ms=d["starting_deadline_ms"],
        concurrency_policy=ConcurrencyPolicy(d["concurrency_policy"]),
        idempotency_key=d["idempotency_key"],
        queue=d["queue"],
    )


_REPLAY_FIELDS = tuple(f.name for f in dataclasses.fields(ReplayRun))

_BODY_TO: dict[type, Callable[[Any], tuple[str, dict[str, Any]]]] = {
    ScheduleJob: _schedule_to,
    CancelJob: lambda b: (_name("CancelJob"), {"reason": b.reason}),
    PauseJob: lambda b: (_name("PauseJob"), {"reason": b.reason}),
    ResumeJob: lambda b: (_name("ResumeJob"), {"reason": b.reason}),
    TriggerJob: lambda b: (_name("TriggerJob"), {"reason": b.reason}),
    ReplayRun: lambda b: (_name("ReplayRun"), {f: getattr(b, f) for f in _REPLAY_FIELDS}),
}

_BODY_FROM: dict[str, Callable[[dict[str, Any]], Any]] = {
    _name("ScheduleJob"): _schedule_from,
    _name("CancelJob"): lambda d: CancelJob(d["reason"]),
    _name("PauseJob"): lambda d: PauseJob(d["reason"]),
    _name("ResumeJob"): lambda d: ResumeJob(d["reason"]),
    _name("TriggerJob"): lambda d: TriggerJob(d["reason"]),
    _name("ReplayRun"): lambda d: ReplayRun(**d),
}


def _command_to(c: JobCommand) -> dict[str, Any]:
    body = _BODY_TO.get(type(c.body))
    if body is None:
        raise ValidationError("body", f"unsupported command body {c.body!r}")
    return {
        "command_id": c.command_id,
        "job_id": c.job_id,
        "issued_at_ms": c.issued_at_ms,
        "body": body(c.body),
    }


def _command_from(d: dict[str, Any]) -> JobCommand:
    name, body = d["body"]
    return JobCommand(d["command_id"], d["job_id"], d["issued_at_ms"], _BODY_FROM[name](body))


_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(Run))
_STATUS_FIELDS = tuple(f.name for f in dataclasses.fields(StatusEvent))


def _run_to(r: Run) -> dict[str, Any]:
    return {f: getattr(r, f) for f in _RUN_FIELDS}


def _run_from(d: dict[str, Any]) -> Run:
    return Run(**d)


def _status_to(e: StatusEvent) -> dict[str, Any]:
    out = {f: getattr(e, f) for f in _STATUS_FIELDS}
    out["state"] = str(e.state)
    return out


def _status_from(d: dict[str, Any]) -> StatusEvent:
    d["state"] = State(d["state"])
    return StatusEvent(**d)


#: The model of each record name of the contract, and the fields that hold an enum member.
RECORD_MODELS: dict[str, type] = {
    _name(model.__name__): model
    for model in (
        JobCommand,
        ScheduleJob,
        Now,
        At,
        After,
        Every,
        Cron,
        CancelJob,
        PauseJob,
        ResumeJob,
        TriggerJob,
        ReplayRun,
        Run,
        StatusEvent,
    )
}
_ENUM_FIELDS: dict[str, type[enum.Enum]] = {
    "state": State,
    "concurrency_policy": ConcurrencyPolicy,
}


def _is_record(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "record"


def values_maker(parsed: Any) -> Callable[[list[Any]], Any] | None:
    """A function building the model of a (fastavro-parsed) record schema from the values the
    codec's fast path reads (:mod:`jobwheel.schemas.flat`: a nested record as the list of its
    values, a union of records as ``(full name, values)``), positionally: a model with twenty
    fields costs a third of what ``model(**record)`` does. A model field the schema lacks
    takes the model's default (the codec asks only where those are the schema's defaults
    too); None when the schema has a record or a field the models do not."""
    if not _is_record(parsed):
        return None
    model = RECORD_MODELS.get(parsed["name"])
    if model is None:
        return None
    index = {f["name"]: (i, f["type"]) for i, f in enumerate(parsed["fields"])}
    model_fields = dataclasses.fields(model)
    if not set(index) <= {f.name for f in model_fields}:
        return None
    env: dict[str, Any] = {"model": model}
    args = []
    for f in model_fields:
        found = index.get(f.name)
        if found is None:
            if f.default is dataclasses.MISSING:
                return None
            env[f"default_{f.name}"] = f.default
            args.append(f"default_{f.name}")
            continue
        i, schema = found
        if _is_record(schema):
            env[f"make_{f.name}"] = sub = values_maker(schema)
            if sub is None:
                return None
            args.append(f"make_{f.name}(v[{i}])")
        elif isinstance(schema, list) and schema and all(_is_record(b) for b in schema):
            branches = {b["name"]: values_maker(b) for b in schema}
            if None in branches.values():
                return None
            env[f"branches_{f.name}"] = branches
            args.append(f"branches_{f.name}[v[{i}][0]](v[{i}][1])")
        elif f.name in _ENUM_FIELDS:  # a symbol the enum lacks: KeyError, the codec falls back
            env[f"members_{f.name}"] = {m.value: m for m in _ENUM_FIELDS[f.name]}
            args.append(f"members_{f.name}[v[{i}]]")
        else:
            args.append(f"v[{i}]")
    source = f"def make(v):\n    return model({', '.join(args)})"
    exec(source, env)  # noqa: S102 - built from the models' own field names
    make: Callable[[list[Any]], Any] = env["make"]
    return make


@dataclass(frozen=True)
class _Kind:
    model: type
    to_avro: Callable[[Any], dict[str, Any]]
    from_avro: Callable[[dict[str, Any]], Any]


def _batch_to(b: StatusBatch) -> dict[str, Any]:
    return {"events": list(b.events)}


def _batch_from(d: dict[str, Any]) -> StatusBatch:
    return StatusBatch(tuple(d["events"]))


KINDS: dict[str, _Kind] = {
    _name("JobCommand"): _Kind(JobCommand, _command_to, _command_from),
    _name("Run"): _Kind(Run, _run_to, _run_from),
    _name("StatusEvent"): _Kind(StatusEvent, _status_to, _status_from),
    _name("StatusBatch"): _Kind(StatusBatch, _batch_to, _batch_from),
}
