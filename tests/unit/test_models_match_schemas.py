"""The typed models and the .avsc files must describe the same records.

The schema files are the contract other services read; the models are what our code uses. A field
added to one and not the other would be silently dropped (or filled with a default) on the wire.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest
from fastavro import schemaless_writer

from jobwheel.schemas import models
from jobwheel.schemas.codec import SchemaCatalogue, default_codec
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
    ResumeJob,
    Run,
    ScheduleJob,
    State,
    StatusEvent,
    TriggerJob,
)

CATALOGUE = SchemaCatalogue.load()


def _records(schema: Any, out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every named record in ``schema`` by short name (the parsed schema, recursively)."""
    if isinstance(schema, list):
        for branch in schema:
            _records(branch, out)
    elif isinstance(schema, dict):
        if schema.get("type") == "record":
            out[schema["name"].rsplit(".", 1)[-1]] = schema
            for f in schema["fields"]:
                _records(f["type"], out)
        elif schema.get("type") in ("array", "map"):
            _records(schema.get("items") or schema.get("values"), out)
    return out


def _current_records() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for full_name in ("io.jobwheel.JobCommand", "io.jobwheel.Run", "io.jobwheel.StatusEvent"):
        _records(CATALOGUE.current(full_name).source, out)
    return out


RECORDS = _current_records()
MODELS = {
    name: getattr(models, name)
    for name in RECORDS
    if dataclasses.is_dataclass(getattr(models, name, None))
}


def test_every_avro_record_has_a_model() -> None:
    assert set(MODELS) == set(RECORDS)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_model_fields_match_the_current_schema(name: str) -> None:
    schema_fields = [f["name"] for f in RECORDS[name]["fields"]]
    model_fields = [f.name for f in dataclasses.fields(MODELS[name])]
    assert sorted(model_fields) == sorted(schema_fields)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_model_defaults_match_schema_defaults(name: str) -> None:
    """A default in the model but not in the schema (or different) changes meaning on the wire."""
    model_defaults = {
        f.name: f.default
        for f in dataclasses.fields(MODELS[name])
        if f.default is not dataclasses.MISSING
    }
    for f in RECORDS[name]["fields"]:
        if "default" in f and f["name"] in model_defaults:
            assert model_defaults[f["name"]] == f["default"], f["name"]


def _enum_symbols(name: str) -> list[str]:
    found: list[str] = []

    def walk(s: Any) -> None:
        if isinstance(s, list):
            for x in s:
                walk(x)
        elif isinstance(s, dict):
            if s.get("type") == "enum" and s["name"].rsplit(".", 1)[-1] == name:
                found.extend(s["symbols"])
            for v in s.values():
                if isinstance(v, dict | list):
                    walk(v)

    for full_name in ("io.jobwheel.JobCommand", "io.jobwheel.StatusEvent"):
        walk(CATALOGUE.current(full_name).source)
    return found


@pytest.mark.parametrize("enum", [State, ConcurrencyPolicy])
def test_enum_symbols_match(enum: type) -> None:
    assert [e.value for e in enum] == _enum_symbols(enum.__name__)


TRIGGERS = [
    Now(),
    At(1_700_000_000_123),
    After(5_000),
    Every(60_000),
    Every(60_000, start_at_ms=1_700_000_000_000),
    Cron("*/5 * * * *"),
    Cron("30 2 * * 1-5", "America/New_York"),
]

BODIES = [
    *(ScheduleJob("demo.echo", t) for t in TRIGGERS),
    ScheduleJob(
        task="billing:invoice.send",
        trigger=Cron("0 9 1 * *", "Europe/Berlin"),
        args_json='{"customer": "ü", "amounts": [1, 2.5]}',
        max_attempts=7,
        timeout_ms=120_000,
        visibility_timeout_ms=10_000,
        starting_deadline_ms=300_000,
        concurrency_policy=ConcurrencyPolicy.REPLACE,
        idempotency_key="invoice-2024-01",
    ),
    CancelJob(),
    CancelJob("no longer needed"),
    PauseJob("maintenance"),
    ResumeJob(),
    TriggerJob("manual"),
]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: repr(b)[:60])
def test_every_command_round_trips(body: Any) -> None:
    command = JobCommand("cmd-1", "job-ü-1", 1_700_000_000_000, body)
    decoded = default_codec().decode(default_codec().encode(command))
    assert decoded == command
    assert type(decoded.body) is type(body)


def test_run_round_trips() -> None:
    for timeout in (None, 5_000):
        run = Run(
            run_id="job-1@1700000000000",
            job_id="job-1",
            task="demo.echo",
            args_json="{}",
            seq=42,
            scheduled_time_ms=1_700_000_000_000,
            dispatched_at_ms=1_700_000_000_010,
            attempt=2,
            max_attempts=3,
            timeout_ms=timeout,
            visibility_timeout_ms=30_000,
            deadline_ms=1_700_000_030_010,
            partition=3,
            fencing_token=9,
        )
        assert default_codec().decode(default_codec().encode(run)) == run


@pytest.mark.parametrize("state", list(State))
def test_status_event_round_trips_every_state(state: State) -> None:
    full = StatusEvent(
        event_id="ev-1",
        job_id="job-1",
        state=state,
        event_time_ms=1_700_000_000_000,
        source="worker",
        run_id="job-1@1",
        seq=3,
        attempt=1,
        task="demo.echo",
        scheduled_time_ms=1,
        worker="host:1",
        error="ValueError: x",
        reason="because",
        result_json='{"ok": true}',
        duration_ms=12,
        next_fire_ms=99,
        deadline_ms=100,
        retry_delay_ms=1_000,
    )
    minimal = StatusEvent("ev-2", "job-1", state, 1, "scheduler")
    for event in (full, minimal):
        assert default_codec().decode(default_codec().encode(event)) == event


def test_job_command_v1_is_read_as_v2_with_defaults() -> None:
    """A producer still on job_command.v1 keeps working after readers move to v2."""
    v1 = next(v for v in CATALOGUE.versions if v.label() == "job_command.v1")
    assert default_codec().catalogue.current("io.jobwheel.JobCommand").version > v1.version
    body = io.BytesIO()
    schemaless_writer(
        body,
        v1.parsed,
        {
            "command_id": "c-old",
            "job_id": "job-old",
            "issued_at_ms": 1_600_000_000_000,
            "body": (
                "io.jobwheel.ScheduleJob",
                {
                    "task": "demo.echo",
                    "args_json": '{"a": 1}',
                    "trigger": ("io.jobwheel.Every", {"interval_ms": 1000, "start_at_ms": None}),
                    "max_attempts": 5,
                    "timeout_ms": 2_000,
                    "visibility_timeout_ms": 9_000,
                },
            ),
        },
    )
    data = b"\xc3\x01" + v1.fingerprint + body.getvalue()
    assert default_codec().decode(data) == JobCommand(
        "c-old",
        "job-old",
        1_600_000_000_000,
        ScheduleJob(
            task="demo.echo",
            trigger=Every(1000),
            args_json='{"a": 1}',
            max_attempts=5,
            timeout_ms=2_000,
            visibility_timeout_ms=9_000,
            starting_deadline_ms=None,
            concurrency_policy=ConcurrencyPolicy.ALLOW,
            idempotency_key=None,
        ),
    )


MODEL_CLASSES = [
    obj
    for obj in vars(models).values()
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == models.__name__
]


@pytest.mark.parametrize("model", MODEL_CLASSES, ids=lambda m: m.__name__)
def test_every_model_is_built_as_its_dataclass_would_build_it(model: type) -> None:
    """The models' faster ``__init__`` keeps the dataclass's contract: the same signature and
    defaults, positional and keyword arguments, missing ones refused, fields frozen."""
    import inspect

    reference = dataclasses.make_dataclass(
        model.__name__,
        [(f.name, f.type, f) for f in dataclasses.fields(model)],
        frozen=True,
        slots=True,
    )

    def shape(cls: type) -> list[tuple[str, Any, Any]]:
        params = inspect.signature(cls).parameters.values()
        return [(p.name, p.kind, p.default) for p in params]

    assert shape(model) == shape(reference)
    fields = dataclasses.fields(model)
    values = [f"v{i}" for i in range(len(fields))]
    built = model(*values)
    assert [getattr(built, f.name) for f in fields] == values
    assert model(**{f.name: v for f, v in zip(fields, values, strict=True)}) == built
    required = [f for f in fields if f.default is dataclasses.MISSING]
    if required:
        with pytest.raises(TypeError, match=required[-1].name):
            model(*values[: len(required) - 1])
        optional = [f.name for f in fields if f.default is not dataclasses.MISSING]
        defaults = model(*values[: len(required)])
        assert [getattr(defaults, n) for n in optional] == [
            f.default for f in fields if f.default is not dataclasses.MISSING
        ]
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(built, fields[0].name, "changed")
