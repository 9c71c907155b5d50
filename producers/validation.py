"""The text and SDK forms of a job request, turned into values the contract rules check.

The rules of a complete command (job id, task name, args, triggers, limits) live in
:mod:`jobwheel.schemas.validation`, shared with the scheduler so that "valid" means the same on both
sides of the requests topic. This module holds what only producers need: the SDK's keyword
form (datetimes and timedeltas, :func:`trigger`) and the text forms of the CLI and the HTTP API
(:func:`parse_duration`, :func:`parse_instant`, :func:`schedule_kwargs`). Every failure is a
:class:`jobwheel.errors.ValidationError` naming the field, with long values cut.

The functions are pure: "now" is an argument, so the same rules check a request built by hand.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from jobwheel.errors import ValidationError, clip
from jobwheel.schemas import validation as rules
from jobwheel.schemas.models import After, At, Every, Now, Trigger

MAX_PAST = timedelta(milliseconds=rules.MAX_PAST_MS)
#: Longer duration or instant texts are refused before parsing (int() of 5,000 digits raises).
MAX_TEXT_CHARS = 64

_DURATION_RE = re.compile(r"([0-9]+)(ms|s|m|h|d)", re.ASCII)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


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
    try:
        ms = math.floor(value.timestamp() * 1000)
    except (OverflowError, ValueError) as exc:
        raise ValidationError(field, f"{value.isoformat()} is out of range") from exc
    return rules.epoch_ms(ms, field)


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
        raise ValidationError("start_at", "only applies to an every schedule")
    if now:
        if now is not True:
            raise ValidationError("now", f"must be True, got {clip(now)}")
        return Now()
    if at is not None:
        return At(rules.not_too_old(aware_ms(at, "at"), now_ms))
    if in_ is not None:
        return After(rules.positive_ms(in_, "in"))  # type: ignore[arg-type]
    if every is not None:
        interval = rules.positive_ms(every, "every")
        first = None
        if start_at is not None:
            first = rules.not_too_old(aware_ms(start_at, "start_at"), now_ms, "start_at")
        return Every(interval, first)  # type: ignore[arg-type]
    return rules.cron(cron, tz)


# --- text forms (CLI, HTTP) -----------------------------------------------------------------


def parse_duration(text: Any, field: str) -> timedelta:
    """``250ms``, ``5s``, ``10m``, ``1h30m``, ``2d``: units summed, each a whole number."""
    if not isinstance(text, str):
        raise ValidationError(field, f"must be a duration like 5s, got {type(text).__name__}")
    compact = text.strip().lower()
    if (
        not compact
        or len(compact) > MAX_TEXT_CHARS
        or "".join(m.group(0) for m in _DURATION_RE.finditer(compact)) != compact
    ):
        raise ValidationError(
            field, f"{clip(text)} is not a duration; use e.g. 250ms, 5s, 10m, 1h30m, 2d"
        )
    ms = sum(int(n) * _UNIT_MS[unit] for n, unit in _DURATION_RE.findall(compact))
    if ms <= 0:
        raise ValidationError(field, f"{clip(text)} must be positive")
    if ms > rules.MAX_DURATION_MS:
        raise ValidationError(field, f"{clip(text)} is too large")
    return timedelta(milliseconds=ms)


def duration_ms(value: Any, field: str) -> timedelta | None:
    """A duration given as text (``5s``) or as whole milliseconds (JSON number), or None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return timedelta(milliseconds=rules.positive_ms(value, field))  # type: ignore[arg-type]
    if isinstance(value, str):
        return parse_duration(value, field)
    raise ValidationError(
        field,
        f"must be a duration like 250ms, 5s, 10m, 1h30m, 2d or whole milliseconds, "
        f"got {clip(value)}",
    )


def parse_instant(text: Any, field: str = "at") -> datetime:
    """ISO 8601 with an offset or ``Z``, e.g. ``2030-01-01T09:00:00+01:00``."""
    if not isinstance(text, str):
        raise ValidationError(field, f"must be an ISO 8601 time, got {type(text).__name__}")
    try:
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(text)
        value = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValidationError(
            field, f"{clip(text)} is not an ISO 8601 time; use e.g. 2030-01-01T09:00:00+01:00"
        ) from exc
    if value.tzinfo is None or value.utcoffset() is None:
        # the text form's own advice: the SDK's (pass an aware datetime) means nothing here
        raise ValidationError(
            field,
            f"{clip(text)} has no time zone offset; add one, e.g. {value.isoformat()}+01:00 "
            f"or {value.isoformat()}Z",
        )
    aware_ms(value, field)
    return value


def schedule_kwargs(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping of ``JobClient.schedule`` keyword arguments, with unknown keys refused."""
    unknown = set(spec) - SCHEDULE_KEYS
    if unknown:
        name = sorted(unknown)[0]
        raise ValidationError(
            name if len(name) <= 60 else name[:60] + "…",
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
