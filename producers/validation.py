"""Validation of job requests, run before anything is sent.

A request that reaches the requests topic and is rejected there costs a round trip, a REJECTED
status event and a confused user reading logs; rejecting it here raises at the call site instead,
naming the field. Every failure is a :class:`jobwheel.errors.ValidationError` whose ``field`` is
the user-facing name (``at``, ``in``, ``every``, ``cron``, ``timezone``, ``args``, ``task``,
``job_id``, ``max_attempts``, ``timeout``, ...).

Past instants: an ``at`` up to :data:`MAX_PAST` (1 hour) before now is accepted and fires
immediately (clock skew between hosts, a slow retry of a submit); anything older is almost
certainly a bug (wrong zone, wrong year) and is refused.

The functions are pure: "now" is an argument, so the same rules check a request built by hand.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from jobwheel.errors import ValidationError
from schemas.cron import parse_cron, zone
from schemas.models import (
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
    ScheduleJob,
    Trigger,
    TriggerJob,
)

TASK_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
MAX_ID_CHARS = 200
MAX_REASON_CHARS = 10_000
MAX_PAST = timedelta(hours=1)
MAX_PAST_MS = int(MAX_PAST.total_seconds() * 1000)
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

_DURATION_RE = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def job_id(value: Any, field: str = "job_id") -> str:
    """1..200 characters, none of them whitespace or control characters (it is the record key
    and appears in URLs, logs and run ids)."""
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise ValidationError(field, f"must be 1..{MAX_ID_CHARS} characters, got {len(value)}")
    for ch in value:
        if ch.isspace() or not ch.isprintable():
            raise ValidationError(
                field, f"{value[:40]!r} contains whitespace or a control character ({ch!r})"
            )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(field, f"{value[:40]!r} is not valid Unicode text") from exc
    return value


def task(value: Any) -> str:
    """Task names are registry keys: letters, digits, ``_ . : -``; 1..200 characters."""
    if not isinstance(value, str) or TASK_RE.fullmatch(value) is None:
        raise ValidationError(
            "task",
            f"{value!r} is not a task name; use 1..200 letters, digits, '_', '.', ':' or '-' "
            "(e.g. 'billing.send_invoice')",
        )
    return value


def args_json(args: Any, max_bytes: int) -> str:
    """``args`` as compact JSON text, refusing values JSON cannot carry and oversized payloads.

    ``None`` means no arguments (``{}``). The worker calls the task with an object's items as
    keyword arguments, a list's items as positional ones, any other value as the one argument.
    """
    if args is None:
        return "{}"
    try:
        text = json.dumps(args, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValidationError("args", f"not JSON-serializable: {exc}") from exc
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ValidationError(
            "args",
            f"{size} bytes of JSON, over the {max_bytes}-byte limit (JOBWHEEL_MAX_ARGS_BYTES); "
            "pass a reference (id, URL) instead of the data",
        )
    return text


def args_text(text: Any, max_bytes: int, field: str = "args") -> str:
    """A JSON document given as text (CLI, another service's ``args_json``)."""
    if not isinstance(text, str):
        raise ValidationError(field, f"must be JSON text, got {type(text).__name__}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValidationError(field, f"not valid JSON: {exc}") from exc
    return args_json(value, max_bytes)


def positive_ms(value: Any, field: str, *, allow_none: bool = False) -> int | None:
    """A duration (timedelta, or int milliseconds) as whole milliseconds > 0."""
    if value is None:
        if allow_none:
            return None
        raise ValidationError(field, "is required")
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise ValidationError(
            field, f"must be a timedelta (or int milliseconds), got {type(value).__name__}"
        )
    if ms <= 0:
        raise ValidationError(field, f"must be positive (at least 1 ms), got {value!r}")
    if ms > INT64_MAX // 2:
        raise ValidationError(field, f"{value!r} is too large")
    return ms


def aware_ms(value: Any, field: str) -> int:
    """A time-zone-aware datetime as epoch milliseconds; naive datetimes are ambiguous."""
    if not isinstance(value, datetime):
        raise ValidationError(field, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(
            field,
            f"{value.isoformat()} has no time zone; pass an aware datetime "
            "(e.g. datetime(..., tzinfo=ZoneInfo('Europe/Berlin')) or an ISO time with +01:00/Z)",
        )
    return math.floor(value.timestamp() * 1000)


def not_too_old(at_ms: int, now_ms: int, field: str = "at") -> int:
    """Slightly past instants fire immediately; more than :data:`MAX_PAST` ago is refused."""
    if at_ms < now_ms - MAX_PAST_MS:
        ago = timedelta(milliseconds=now_ms - at_ms)
        raise ValidationError(
            field,
            f"is {ago} in the past (more than {MAX_PAST} ago); check the date and time zone, "
            "or use now=True to run immediately",
        )
    return at_ms


def concurrency_policy(value: Any) -> ConcurrencyPolicy:
    if isinstance(value, ConcurrencyPolicy):
        return value
    if isinstance(value, str):
        try:
            return ConcurrencyPolicy(value.upper())
        except ValueError:
            pass
    raise ValidationError(
        "concurrency_policy",
        f"{value!r} is not one of {', '.join(p.value for p in ConcurrencyPolicy)}",
    )


def max_attempts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX:
        raise ValidationError("max_attempts", f"must be an integer >= 1, got {value!r}")
    return value


def optional_text(value: Any, field: str, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise ValidationError(field, f"is {len(value)} characters; at most {max_chars}")
    return value


def idempotency_key(value: Any) -> str | None:
    if value is None:
        return None
    return job_id(value, field="idempotency_key")


def trigger(
    *,
    now: bool = False,
    at: datetime | None = None,
    in_: timedelta | None = None,
    every: timedelta | None = None,
    cron: str | None = None,
    tz: str = "UTC",
    start_at: datetime | None = None,
    now_ms: int,
) -> Trigger:
    """Exactly one of now/at/in_/every/cron, checked and turned into a trigger model."""
    given = [
        name
        for name, value in (("now", now), ("at", at), ("in", in_), ("every", every), ("cron", cron))
        if value is not None and value is not False
    ]
    if len(given) != 1:
        raise ValidationError(
            "trigger",
            "give exactly one of now, at, in, every, cron"
            + (f" (got {', '.join(given)})" if given else ""),
        )
    if start_at is not None and every is None:
        raise ValidationError("start_at", "only applies to every=")
    if now:
        if now is not True:
            raise ValidationError("now", f"must be True, got {now!r}")
        return Now()
    if at is not None:
        return At(not_too_old(aware_ms(at, "at"), now_ms))
    if in_ is not None:
        return After(positive_ms(in_, "in"))  # type: ignore[arg-type]
    if every is not None:
        interval = positive_ms(every, "every")
        first = None
        if start_at is not None:
            first = not_too_old(aware_ms(start_at, "start_at"), now_ms, "start_at")
        return Every(interval, first)  # type: ignore[arg-type]
    if not isinstance(tz, str):
        raise ValidationError("timezone", f"must be an IANA zone name, got {type(tz).__name__}")
    parse_cron(cron)  # type: ignore[arg-type]
    zone(tz)
    return Cron(cron, tz)  # type: ignore[arg-type]


# --- whole commands (a request built by hand, or the final gate of the client) ---------------


def check_trigger(t: Any, issued_at_ms: int) -> Trigger:
    if isinstance(t, Now):
        return t
    if isinstance(t, At):
        _long(t.at_ms, "at")
        return At(not_too_old(t.at_ms, issued_at_ms))
    if isinstance(t, After):
        positive_ms(_long(t.delay_ms, "in"), "in")
        return t
    if isinstance(t, Every):
        positive_ms(_long(t.interval_ms, "every"), "every")
        if t.start_at_ms is not None:
            not_too_old(_long(t.start_at_ms, "start_at"), issued_at_ms, "start_at")
        return t
    if isinstance(t, Cron):
        parse_cron(t.expression)
        zone(t.timezone)
        return t
    raise ValidationError("trigger", f"unsupported trigger {t!r}")


def check_command(command: JobCommand, *, now_ms: int, max_args_bytes: int) -> JobCommand:
    """Every rule above, applied to a complete command. Returns it unchanged if valid."""
    job_id(command.job_id)
    job_id(command.command_id, field="command_id")
    _long(command.issued_at_ms, "issued_at_ms")
    body = command.body
    if isinstance(body, ScheduleJob):
        task(body.task)
        args_text(body.args_json, max_args_bytes)
        check_trigger(body.trigger, now_ms)
        max_attempts(body.max_attempts)
        positive_ms(body.timeout_ms, "timeout", allow_none=True)
        positive_ms(body.visibility_timeout_ms, "visibility_timeout")
        positive_ms(body.starting_deadline_ms, "starting_deadline", allow_none=True)
        concurrency_policy(body.concurrency_policy)
        idempotency_key(body.idempotency_key)
    elif isinstance(body, CancelJob | PauseJob | ResumeJob | TriggerJob):
        optional_text(body.reason, "reason", MAX_REASON_CHARS)
    else:
        raise ValidationError("body", f"unsupported command {body!r}")
    return command


def _long(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > INT64_MAX:
        raise ValidationError(field, f"must be an integer (milliseconds), got {value!r}")
    return value


# --- text forms (CLI, HTTP) -----------------------------------------------------------------


def parse_duration(text: Any, field: str) -> timedelta:
    """``250ms``, ``5s``, ``10m``, ``1h30m``, ``2d``: units summed, each a whole number."""
    if not isinstance(text, str):
        raise ValidationError(field, f"must be a duration like 5s, got {type(text).__name__}")
    compact = text.strip().lower()
    if not compact or "".join(m.group(0) for m in _DURATION_RE.finditer(compact)) != compact:
        raise ValidationError(
            field, f"{text!r} is not a duration; use e.g. 250ms, 5s, 10m, 1h30m, 2d"
        )
    ms = sum(int(n) * _UNIT_MS[unit] for n, unit in _DURATION_RE.findall(compact))
    if ms <= 0:
        raise ValidationError(field, f"{text!r} must be positive")
    if ms > INT64_MAX // 2:
        raise ValidationError(field, f"{text!r} is too large")
    return timedelta(milliseconds=ms)


def parse_instant(text: Any, field: str = "at") -> datetime:
    """ISO 8601 with an offset or ``Z``, e.g. ``2030-01-01T09:00:00+01:00``."""
    if not isinstance(text, str):
        raise ValidationError(field, f"must be an ISO 8601 time, got {type(text).__name__}")
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValidationError(
            field, f"{text!r} is not an ISO 8601 time; use e.g. 2030-01-01T09:00:00+01:00"
        ) from exc
    aware_ms(value, field)
    return value


def schedule_kwargs(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping of ``JobClient.schedule`` keyword arguments, with unknown keys refused."""
    unknown = set(spec) - SCHEDULE_KEYS
    if unknown:
        raise ValidationError(
            sorted(unknown)[0],
            f"unknown option; expected some of {', '.join(sorted(SCHEDULE_KEYS))}",
        )
    return dict(spec)


SCHEDULE_KEYS = frozenset(
    {
        "job_id",
        "task",
        "args",
        "now",
        "at",
        "in_",
        "every",
        "cron",
        "tz",
        "start_at",
        "max_attempts",
        "timeout",
        "visibility_timeout",
        "starting_deadline",
        "concurrency_policy",
        "idempotency_key",
    }
)
