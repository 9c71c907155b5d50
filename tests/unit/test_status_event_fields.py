"""Every field of a status event goes all the way: contract, model, writers, codec, store, API.

The checklist is schemas/README.md, "Adding a field to a status event". For each field of
:class:`~jobwheel.schemas.models.StatusEvent` this test checks the steps that can be checked: the
newest ``status_event.v<N>.avsc`` has it, the flat codec reads it back, a scheduler or worker
builder passes it, the store writes it (``EVENT_COLUMNS``, ``event_row``, ``_COLUMN_RULES``) to a
column of ``status_events`` that the migrations create, and the API shows it. A field that is
not stored or not shown is listed below with the reason; those lists are checked too (an entry
for a field that does not exist, or one that is stored after all, is a complaint).

The checks are one function of what each step left behind (:class:`Steps`, read from the code
by :func:`read_steps`), so the last tests feed it a set with one step left out and see it name
that step and its file. The migrations are read from their SQL (:func:`status_events_columns`);
one test holds that reading to the columns of a store the migrations really built.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from jobwheel.consumers.status import queries
from jobwheel.consumers.status import store as status_store
from jobwheel.consumers.status.routes import models as api_models
from jobwheel.consumers.status.sink import EventRows
from jobwheel.consumers.status.store import Migration, StatusStore, load_migrations
from jobwheel.schemas.catalogue import SchemaCatalogue
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.models import State, StatusEvent

ROOT = Path(__file__).resolve().parents[2]
STATUS_EVENT = "io.jobwheel.StatusEvent"
#: The newest status_event version's label (status_event.v4 when queue was added).
NEWEST = SchemaCatalogue.load().current(STATUS_EVENT).label()

#: Fields the status store has no column for, and why.
NOT_STORED: Mapping[str, str] = {
    "started_ms": "a quick run's start becomes a STARTED row of its own (sink._started_row)",
}
#: Columns the sink writes that are no field of the event: where it read the record.
SINK_COLUMNS = frozenset({"kafka_partition", "kafka_offset"})

#: The API's views of what the store holds. EventView is a job's or a run's events
#: (GET /jobs/{id}, GET /runs/{id}); a field shown in another view is named here as "View.field".
API_VIEWS: Mapping[str, type[BaseModel]] = {
    "EventView": api_models.EventView,
    "JobView": api_models.JobView,
    "RunView": api_models.RunView,
}
SHOWN_ELSEWHERE: Mapping[str, tuple[str, ...]] = {
    "job_id": ("JobView.job_id", "RunView.job_id"),
    "task": ("JobView.task", "RunView.task"),
    "queue": ("JobView.queue", "RunView.queue"),
    "next_fire_ms": ("JobView.next_fire_ms",),
    "scheduled_time_ms": ("RunView.scheduled_time_ms",),
    "result_json": ("RunView.result_json",),
    "duration_ms": ("RunView.duration_ms",),
    "deadline_ms": ("RunView.deadline_ms",),
    "started_ms": ("RunView.started_ms",),
}
#: Fields the API does not show, and why.
NOT_SHOWN: Mapping[str, str] = {
    "event_id": "the store's deduplication key; a command's answer is found by it and shown "
    "as CommandVerdict, not the id itself",
    "retry_delay_ms": "the scheduler's RETRYING event says it in its reason ('attempt 2 of 3 "
    "in 5000 ms'), which EventView shows",
    "spec_json": "the job's definition: the console's job page shows it (queries.job_spec); "
    "the API has no view of it",
}

#: Where the builders of status events live: the scheduler's rules and the worker's pool.
WRITERS = ("streams/rules", "consumers/worker/pooling")
#: The functions that build an event from keyword arguments.
BUILDERS = frozenset({"StatusEvent", "_event"})


@dataclasses.dataclass(frozen=True)
class Steps:
    """What each step of the checklist left behind, as the checks read it."""

    #: StatusEvent's attributes (schemas/models.py).
    fields: tuple[str, ...]
    #: The newest status_event version's label and field names (schemas/avro/).
    schema_label: str
    schema_fields: tuple[str, ...]
    #: The flat codec's reading of an encoded :func:`sample` (field -> value; None: the codec
    #: has no fast path for the schema).
    codec_values: Mapping[str, Any] | None
    #: Keyword arguments the builders pass (streams/rules/, consumers/worker/pooling/).
    writer_keywords: frozenset[str]
    #: consumers/status/store.py: EVENT_COLUMNS, and the row of :func:`sample` by column as
    #: event_row makes it and as the sink's fast path makes it from the encoded sample.
    event_columns: tuple[str, ...]
    rows: Mapping[str, Mapping[str, Any]]
    #: row_fits's complaint about event_row(sample) (a column without a rule), or None.
    row_problem: str | None
    #: The columns of status_events after every migration.
    table_columns: frozenset[str]
    #: Each API view's fields, and the columns the events query selects (queries.py).
    api_views: Mapping[str, frozenset[str]]
    event_query_columns: tuple[str, ...]
    #: The declared exceptions (above).
    not_stored: Mapping[str, str] = dataclasses.field(default_factory=lambda: NOT_STORED)
    shown_elsewhere: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: SHOWN_ELSEWHERE
    )
    not_shown: Mapping[str, str] = dataclasses.field(default_factory=lambda: NOT_SHOWN)


def sample() -> StatusEvent:
    """A StatusEvent with every field set, each to a value of its own (none the default)."""
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(StatusEvent)):
        kind = str(f.type)
        if kind.startswith("State"):
            values[f.name] = State.SUCCEEDED
        elif kind.startswith("int"):
            values[f.name] = 1_000 + i
        elif kind.startswith("str"):
            values[f.name] = f"{f.name}-value"
        elif kind.startswith("bool"):
            values[f.name] = True
        else:
            raise AssertionError(f"{f.name}: no sample value for a {kind}; add one to sample()")
    return StatusEvent(**values)


def wire(value: Any) -> Any:
    """A value as the codec and the store hold it (an enum as its symbol)."""
    return value.value if isinstance(value, enum.Enum) else value


# --- the checks ------------------------------------------------------------------------------


def gaps(steps: Steps, event: StatusEvent) -> list[str]:
    """Every step left out for a field, one line each naming the field and where to do it;
    empty when every field went all the way. ``event`` is the :func:`sample` the values in
    ``steps`` were read from."""
    out: list[str] = []
    fields = steps.fields
    label = steps.schema_label
    out += [
        f"{f}: not in {label}.avsc (schemas/avro/): add status_event.v<N+1> with it"
        for f in fields
        if f not in steps.schema_fields
    ]
    out += [
        f"{f}: in {label}.avsc but not an attribute of StatusEvent (schemas/models.py)"
        for f in steps.schema_fields
        if f not in fields
    ]
    out += _codec_gaps(steps, event)
    out += [
        f"{f}: no builder passes it (streams/rules/core.py ProcessorCore._event, "
        "consumers/worker/pooling/verdicts.py Verdicts._event): every event carries the default"
        for f in fields
        if f not in steps.writer_keywords
    ]
    out += _store_gaps(steps, event)
    out += _api_gaps(steps)
    return out


def _codec_gaps(steps: Steps, event: StatusEvent) -> list[str]:
    if steps.codec_values is None:
        return [
            f"the flat codec has no fast path for {steps.schema_label} (schemas/flat.py: every "
            "field a string, int, long, boolean, enum or a null union of one)"
        ]
    out = []
    for f in steps.fields:
        if f not in steps.codec_values:
            out.append(f"{f}: the flat codec does not read it (schemas/flat.py)")
        elif steps.codec_values[f] != wire(getattr(event, f)):
            out.append(
                f"{f}: the flat codec reads {steps.codec_values[f]!r} back, not "
                f"{wire(getattr(event, f))!r} (schemas/flat.py, schemas/_flat.c)"
            )
    return out


def _store_gaps(steps: Steps, event: StatusEvent) -> list[str]:
    where = "consumers/status/store.py"
    fields, columns = steps.fields, steps.event_columns
    out = [
        f"{f}: not in EVENT_COLUMNS ({where}) nor in NOT_STORED with the reason"
        for f in fields
        if f not in columns and f not in steps.not_stored
    ]
    out += [
        f"{f}: in NOT_STORED but stored (EVENT_COLUMNS)" for f in steps.not_stored if f in columns
    ]
    out += [
        f"{f}: in NOT_STORED but no field of StatusEvent"
        for f in steps.not_stored
        if f not in fields
    ]
    out += [
        f"column {c}: in EVENT_COLUMNS ({where}) but no field of StatusEvent"
        for c in columns
        if c not in fields and c not in SINK_COLUMNS
    ]
    for maker, row in steps.rows.items():
        for f in (f for f in fields if f in columns):
            want = wire(getattr(event, f))
            if row.get(f) != want:
                out.append(f"{f}: {maker} puts {row.get(f)!r} in its column, not {want!r}")
    if steps.row_problem is not None:
        out.append(f"event_row's row does not pass row_fits ({where}): {steps.row_problem}")
    out += [
        f"{c}: no column of status_events (consumers/status/migrations/: add NNNN_*.sql with "
        f"ALTER TABLE status_events ADD COLUMN IF NOT EXISTS {c} ...)"
        for c in columns
        if c not in steps.table_columns
    ]
    return out


def _api_gaps(steps: Steps) -> list[str]:
    where = "consumers/status/routes/models.py"
    events = steps.api_views.get("EventView", frozenset())
    out = []
    for f in steps.fields:
        shown = f in events or f in steps.shown_elsewhere
        if not shown and f not in steps.not_shown:
            out.append(
                f"{f}: the API shows it nowhere (EventView in {where} and queries.EVENT_COLUMNS; "
                "or another view in SHOWN_ELSEWHERE; or NOT_SHOWN with the reason)"
            )
        if shown and f in steps.not_shown:
            out.append(f"{f}: in NOT_SHOWN but shown")
        for target in steps.shown_elsewhere.get(f, ()):
            view, _, name = target.partition(".")
            if name not in steps.api_views.get(view, frozenset()):
                out.append(f"{f}: SHOWN_ELSEWHERE names {target}, which {where} does not have")
    listed = {*steps.shown_elsewhere, *steps.not_shown}
    out += [
        f"{f}: listed for the API but no field of StatusEvent"
        for f in sorted(listed - set(steps.fields))
    ]
    out += [
        f"EventView.{f}: queries.EVENT_COLUMNS (consumers/status/queries.py) does not select it"
        for f in sorted(events)
        if f not in steps.event_query_columns
    ]
    return out


# --- reading the steps from the code -----------------------------------------------------------


def status_events_columns(migrations: Sequence[Migration]) -> frozenset[str]:
    """The columns of ``status_events`` after ``migrations``, read from their SQL: the
    ``CREATE TABLE`` column list, then each ``ALTER TABLE ... ADD/DROP COLUMN``."""
    columns: set[str] = set()
    for migration in migrations:
        for statement in migration.statements(ttl_days=30):
            words = statement.split()
            if words[:2] == ["CREATE", "TABLE"] and "status_events" in words[2:6]:
                body = statement[statement.index("(") + 1 :]
                columns = {part.split()[0] for part in _top_level(body) if part.split()}
            elif words[:3] == ["ALTER", "TABLE", "status_events"]:
                for clause in _top_level(" ".join(words[3:]) + ")"):
                    parts = [w for w in clause.split() if w not in ("IF", "NOT", "EXISTS")]
                    if parts[:2] == ["ADD", "COLUMN"]:
                        columns.add(parts[2])
                    elif parts[:2] == ["DROP", "COLUMN"]:
                        columns.discard(parts[2])
    return frozenset(columns)


def _top_level(text: str) -> list[str]:
    """The comma-separated parts of ``text`` up to the parenthesis that closes it."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                parts.append(text[start:i])
                break
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [p.strip() for p in parts]


def builder_keywords(folders: Iterable[Path]) -> frozenset[str]:
    """The keyword arguments of every call to a builder (:data:`BUILDERS`) in ``folders``,
    and the string keys of the dicts a builder spreads into its event (``**values``)."""
    found: set[str] = set()
    for folder in folders:
        for path in sorted(folder.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and _name(node.func) in BUILDERS:
                    found.update(k.arg for k in node.keywords if k.arg)
                elif isinstance(node, ast.FunctionDef) and node.name in BUILDERS:
                    for inner in ast.walk(node):
                        if isinstance(inner, ast.Dict):
                            found.update(
                                k.value
                                for k in inner.keys
                                if isinstance(k, ast.Constant) and isinstance(k.value, str)
                            )
    return frozenset(found)


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def read_steps(native: bool = True) -> Steps:
    """The steps as the code has them now (the store's module attributes are read at call
    time, so a test may replace one)."""
    event = sample()
    current = SchemaCatalogue.load().current(STATUS_EVENT)
    codec = Codec(native=native)
    encoded = codec.encode(event)
    decoded = codec.decode_fields(encoded)
    columns = tuple(status_store.EVENT_COLUMNS)
    try:
        problem = status_store.row_fits(status_store.event_row(event))
    except KeyError as exc:
        problem = f"the column {exc} has no rule in _COLUMN_RULES"
    except ValueError as exc:  # a row longer or shorter than EVENT_COLUMNS
        problem = str(exc)
    sink_row = EventRows(codec).rows(encoded, event.source, -1, -1)[0]
    return Steps(
        fields=tuple(f.name for f in dataclasses.fields(StatusEvent)),
        schema_label=current.label(),
        schema_fields=tuple(f["name"] for f in current.parsed["fields"]),
        codec_values=None if decoded is None else dict(zip(decoded[1], decoded[2], strict=True)),
        writer_keywords=builder_keywords(ROOT / folder for folder in WRITERS),
        event_columns=columns,
        rows={
            "event_row": dict(zip(columns, status_store.event_row(event), strict=False)),
            "the sink's fast path (sink.py EventRows)": dict(zip(columns, sink_row, strict=False)),
        },
        row_problem=problem,
        table_columns=status_events_columns(status_store.load_migrations()),
        api_views={name: frozenset(model.model_fields) for name, model in API_VIEWS.items()},
        event_query_columns=tuple(queries.EVENT_COLUMNS),
    )


# --- today: every step is done ----------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_every_status_event_field_went_all_the_way(native: bool) -> None:
    found = gaps(read_steps(native), sample())
    assert not found, "steps left out (schemas/README.md, Adding a field):\n" + "\n".join(found)


def test_the_migrations_are_read_as_the_store_builds_them(store: StatusStore) -> None:
    """The SQL reading above agrees with a store the migrations really built."""
    built = {row[0] for row in store.client.query("DESCRIBE TABLE status_events").result_rows}
    assert status_events_columns(status_store.load_migrations()) == built


def test_the_sample_sets_every_field_to_a_value_of_its_own() -> None:
    event = sample()
    values = [wire(getattr(event, f.name)) for f in dataclasses.fields(StatusEvent)]
    defaults = [f.default for f in dataclasses.fields(StatusEvent)]
    assert not set(values) & set(defaults) and len({repr(v) for v in values}) == len(values)


# --- a step left out is named -------------------------------------------------------------------


def _without(mapping: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}


def _left_out(steps: Steps, step: str) -> Steps:
    """``steps`` with the field ``queue`` (status_event.v4) left out of one step."""
    q = "queue"
    if step == "schema":
        return dataclasses.replace(
            steps, schema_fields=tuple(f for f in steps.schema_fields if f != q)
        )
    if step == "codec":
        assert steps.codec_values is not None
        return dataclasses.replace(steps, codec_values=_without(steps.codec_values, q))
    if step == "writers":
        return dataclasses.replace(steps, writer_keywords=steps.writer_keywords - {q})
    if step == "EVENT_COLUMNS":
        return dataclasses.replace(
            steps, event_columns=tuple(c for c in steps.event_columns if c != q)
        )
    if step == "event_row":
        row = dict(steps.rows["event_row"], queue=None)  # the value left out of the row
        return dataclasses.replace(steps, rows={**steps.rows, "event_row": row})
    if step == "migration":
        return dataclasses.replace(steps, table_columns=steps.table_columns - {q})
    if step == "API":
        views = {**steps.api_views, "JobView": steps.api_views["JobView"] - {q}}
        return dataclasses.replace(steps, api_views=views)
    raise AssertionError(step)


LEFT_OUT = {
    "schema": f"queue: not in {NEWEST}.avsc (schemas/avro/)",
    "codec": "queue: the flat codec does not read it (schemas/flat.py)",
    "writers": "queue: no builder passes it (streams/rules/core.py",
    "EVENT_COLUMNS": "queue: not in EVENT_COLUMNS (consumers/status/store.py)",
    "event_row": "queue: event_row puts None in its column, not 'queue-value'",
    "migration": "queue: no column of status_events (consumers/status/migrations/",
    "API": "queue: SHOWN_ELSEWHERE names JobView.queue, which consumers/status/routes/models.py",
}


@pytest.mark.parametrize("step", sorted(LEFT_OUT))
def test_a_step_left_out_is_named_with_its_file(step: str) -> None:
    found = gaps(_left_out(read_steps(native=False), step), sample())
    assert len(found) == 1 and found[0].startswith(LEFT_OUT[step]), found


def test_a_field_only_added_to_the_model_is_named_at_every_step() -> None:
    """A newcomer's first step alone: ``priority`` in StatusEvent, nowhere else."""
    steps = read_steps(native=False)
    steps = dataclasses.replace(steps, fields=(*steps.fields, "priority"))
    found = [line for line in gaps(steps, sample()) if line.startswith("priority:")]
    assert [line.split("(")[0] for line in found] == [
        f"priority: not in {NEWEST}.avsc ",
        "priority: the flat codec does not read it ",
        "priority: no builder passes it ",
        "priority: not in EVENT_COLUMNS ",
        "priority: the API shows it nowhere ",
    ]


def test_a_stored_field_without_its_migration_is_named() -> None:
    """The migrations before 0011 (status_event.v4's) have no column ``queue``."""
    steps = read_steps(native=False)
    before = [m for m in load_migrations() if m.version < 11]
    found = gaps(dataclasses.replace(steps, table_columns=status_events_columns(before)), sample())
    assert found == [
        "queue: no column of status_events (consumers/status/migrations/: add NNNN_*.sql with "
        "ALTER TABLE status_events ADD COLUMN IF NOT EXISTS queue ...)"
    ]


def test_a_stale_or_contradicting_exception_is_named() -> None:
    steps = read_steps(native=False)
    stale = dataclasses.replace(
        steps,
        not_stored={**NOT_STORED, "queue": "said so", "gone": "a field since removed"},
        not_shown={**NOT_SHOWN, "worker": "said so"},
    )
    assert gaps(stale, sample()) == [
        "queue: in NOT_STORED but stored (EVENT_COLUMNS)",
        "gone: in NOT_STORED but no field of StatusEvent",
        "worker: in NOT_SHOWN but shown",
    ]


def test_an_event_view_field_the_query_does_not_select_is_named() -> None:
    steps = read_steps(native=False)
    query = tuple(c for c in steps.event_query_columns if c != "worker")
    found = gaps(dataclasses.replace(steps, event_query_columns=query), sample())
    assert found == [
        "EventView.worker: queries.EVENT_COLUMNS (consumers/status/queries.py) does not select it"
    ]
