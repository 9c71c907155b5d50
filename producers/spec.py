"""One definition of a job's schedule options: :class:`JobSpec`, its fields, their defaults, how
each is written as text and its help. The SDK (``JobClient.schedule``, ``schedule_many``, the
async client), ``jobwheel submit`` (its options are made from these fields) and the API's
``POST /jobs`` body (its model is made from them too) all read options through here;
:func:`build_schedule` turns a spec into the validated command by the contract's rules
(:mod:`jobwheel.schemas.validation`).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jobwheel.errors import ValidationError, clip
from jobwheel.producers import validation as v
from jobwheel.schemas import timetext
from jobwheel.schemas import validation as rules
from jobwheel.schemas.models import DEFAULT_QUEUE, ConcurrencyPolicy, JobCommand, ScheduleJob

DEFAULT_VISIBILITY_TIMEOUT = timedelta(seconds=30)

#: How an option is written as text: ``text`` as is, ``duration`` and ``instant`` by
#: :mod:`jobwheel.schemas.timetext`, ``int`` a whole number, ``json`` the task's arguments,
#: ``flag`` present or not.
FORMS = ("text", "duration", "instant", "int", "json", "flag")


def _option(
    default: Any,
    help: str,
    *,
    form: str = "text",
    metavar: str | None = None,
    cli: str | None = None,
    json: str | None = None,
) -> Any:
    """A field of :class:`JobSpec` with what the text forms need: its ``form``, its ``help``,
    and its name on the command line (``cli``) or in JSON (``json``) where that differs from
    the field's."""
    assert form in FORMS
    meta = {"help": help, "form": form, "metavar": metavar, "cli": cli, "json": json}
    if default is dataclasses.MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """The options of ``schedule`` as a value (``schedule_many`` takes a list of them).

    Exactly one of ``now``/``at``/``in_``/``every``/``cron`` is required. ``at`` and
    ``start_at`` are aware datetimes or ISO 8601 text with an offset
    (``"2030-01-01T09:00:00+01:00"``), durations timedeltas or duration text (``"5s"``), as on
    the command line. ``tz`` applies to ``cron`` only.
    """

    task: str = _option(dataclasses.MISSING, "registered task name, e.g. demo.echo", metavar="NAME")
    job_id: str | None = _option(
        None,
        "job id (default: a new uuid; the same id replaces the job)",
        metavar="JOB_ID",
        cli="id",
    )
    args: Any = _option(
        None, "task arguments as JSON (an object becomes kwargs)", form="json", metavar="JSON"
    )
    now: bool = _option(False, "run once, now", form="flag")
    at: datetime | str | None = _option(
        None, "run once at an ISO 8601 time with an offset or Z", form="instant", metavar="ISO8601"
    )
    in_: timedelta | str | None = _option(
        None, "run once after DURATION", form="duration", metavar="DURATION", cli="in", json="in"
    )
    every: timedelta | str | None = _option(
        None,
        f"run every DURATION (at least {rules.MIN_EVERY_MS // 1000}s)",
        form="duration",
        metavar="DURATION",
    )
    cron: str | None = _option(None, "five-field cron expression", metavar="EXPR")
    tz: str = _option("UTC", "IANA time zone of cron (default UTC)", metavar="ZONE")
    start_at: datetime | str | None = _option(
        None, "first fire of every (ISO 8601)", form="instant", metavar="ISO8601"
    )
    max_attempts: int = _option(3, "attempts per run (default 3)", form="int", metavar="N")
    timeout: timedelta | str | None = _option(
        None, "per-attempt time limit", form="duration", metavar="DURATION"
    )
    visibility_timeout: timedelta | str = _option(
        DEFAULT_VISIBILITY_TIMEOUT,
        "redeliver after this (default 30s)",
        form="duration",
        metavar="DURATION",
    )
    starting_deadline: timedelta | str | None = _option(
        None, "a fire later than this is MISSED", form="duration", metavar="DURATION"
    )
    concurrency_policy: ConcurrencyPolicy | str = _option(
        ConcurrencyPolicy.ALLOW, "ALLOW, FORBID or REPLACE (default ALLOW)", metavar="POLICY"
    )
    idempotency_key: str | None = _option(None, "apply commands with this key once", metavar="K")
    queue: str = _option(
        DEFAULT_QUEUE,
        "the queue (worker pool) its runs go to: one of JOBWHEEL_QUEUES or added with "
        "`jobwheel queues add` (default 'default')",
        metavar="NAME",
    )


#: The options, in the order of :class:`JobSpec`.
OPTIONS: tuple[dataclasses.Field[Any], ...] = dataclasses.fields(JobSpec)
#: The option names ``schedule`` and a ``schedule_many`` mapping take.
SCHEDULE_KEYS = frozenset(f.name for f in OPTIONS)


def cli_name(option: dataclasses.Field[Any]) -> str:
    """``--NAME`` of ``jobwheel submit``."""
    return "--" + (option.metadata["cli"] or option.name).replace("_", "-")


def json_name(option: dataclasses.Field[Any]) -> str:
    """The option's key in the API's JSON body."""
    return str(option.metadata["json"] or option.name)


def spec_from_mapping(options: Mapping[str, Any]) -> JobSpec:
    """A spec from ``schedule`` keyword arguments as a mapping; unknown keys are refused."""
    unknown = set(options) - SCHEDULE_KEYS
    if unknown:
        name = sorted(unknown)[0]
        # A blank key is named by its repr: an error's field is never empty.
        shown = name if name.strip() else repr(name)
        raise ValidationError(
            shown if len(shown) <= 60 else shown[:60] + "…",
            f"unknown option; expected some of {', '.join(sorted(SCHEDULE_KEYS))}",
        )
    if "task" not in options:
        raise ValidationError("task", "is required")
    return JobSpec(**options)


def spec_from_text(
    options: Mapping[str, Any], *, max_args_bytes: int, args_as_text: bool
) -> JobSpec:
    """A spec from the text forms of ``jobwheel submit`` and the API, by field name (a value
    None means the option's default): durations (``5s``, or whole milliseconds from JSON) and
    instants (ISO 8601 with an offset) by :mod:`jobwheel.schemas.timetext`, whole numbers given
    as text, and the task's arguments as JSON text when ``args_as_text`` (the command line)."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        value = options.get(option.name)
        if value is None:
            continue
        form = option.metadata["form"]
        name = json_name(option)
        if form == "duration":
            value = v.duration_ms(value, name)
        elif form == "instant":
            value = timetext.parse_instant(value, name)
        elif form == "int" and isinstance(value, str):
            if not re.fullmatch(r"[0-9]{1,10}", value.strip(), re.ASCII):
                raise ValidationError(option.name, f"{clip(value)} is not a whole number from 1")
            value = int(value.strip())
        elif form == "json" and args_as_text:
            # the size is checked on the text, before parsing; a deep document cannot crash it
            value = rules.parse_args_text(value, max_args_bytes)
        values[option.name] = value
    if not values.get("task"):
        raise ValidationError("task", "is required (--task NAME, e.g. --task demo.echo)")
    return JobSpec(**values)


def _new_id() -> str:
    return uuid.uuid4().hex


def check_queue(queue: str, declared: Collection[str] | None) -> str:
    """``queue`` by the contract's rule and, when the caller sees the queues (a
    :class:`~jobwheel.kafka.queues.QueueDirectory`, or its settings' ``JOBWHEEL_QUEUES``),
    one of them: the scheduler would answer any other REJECTED, so it is refused before
    anything is sent."""
    rules.queue(queue)
    if declared is not None and queue not in declared:
        raise ValidationError(
            "queue",
            f"{clip(queue)} is not a queue ({', '.join(declared)}); add it with `jobwheel queues "
            "add NAME` (or declare it in JOBWHEEL_QUEUES, here and on the schedulers, and run "
            "`jobwheel topics ensure`), or name one of those",
        )
    return queue


def build_schedule(
    spec: JobSpec,
    *,
    now_ms: int,
    max_args_bytes: int,
    queues: Collection[str] | None = None,
) -> JobCommand:
    """The validated ScheduleJob command for ``spec`` (raises ValidationError naming the field).
    ``queues``: the declared queues, when the caller knows them (see :func:`check_queue`)."""
    job_id = rules.job_id(spec.job_id) if spec.job_id is not None else _new_id()
    trigger = v.trigger(
        now=spec.now,
        at=spec.at,
        in_=spec.in_,
        every=spec.every,
        cron=spec.cron,
        tz=spec.tz,
        start_at=spec.start_at,
        now_ms=now_ms,
    )
    body = ScheduleJob(
        task=rules.task(spec.task),
        trigger=trigger,
        args_json=rules.args_json(spec.args, max_args_bytes),
        max_attempts=rules.max_attempts(spec.max_attempts),
        timeout_ms=rules.positive_ms(
            timetext.duration_value(spec.timeout, "timeout"), "timeout", allow_none=True
        ),
        visibility_timeout_ms=rules.positive_ms(  # type: ignore[arg-type]
            timetext.duration_value(spec.visibility_timeout, "visibility_timeout"),
            "visibility_timeout",
        ),
        starting_deadline_ms=rules.positive_ms(
            timetext.duration_value(spec.starting_deadline, "starting_deadline"),
            "starting_deadline",
            allow_none=True,
        ),
        concurrency_policy=rules.concurrency_policy(spec.concurrency_policy),
        idempotency_key=rules.idempotency_key(spec.idempotency_key),
        queue=check_queue(spec.queue, queues),
    )
    return JobCommand(_new_id(), job_id, now_ms, body)
