"""Cron expressions and time zones: one parser for producers (validation) and the scheduler (fires).

Producers reject a bad expression or zone before anything is sent; the scheduler computes fires
from the same :class:`CronSchedule`, so "valid" means the same thing on both sides of the topic.

Only croniter and zoneinfo are used here. croniter is used for parsing and for iterating *naive
wall-clock* times; its own time-zone arithmetic is not trusted (it drifts across DST changes with
the croniter version faust pins), so mapping wall times to instants is done explicitly.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from jobwheel.errors import ValidationError

#: Nicknames accepted for convenience; stored as their five-field form.
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

FIELD_NAMES = ("minute", "hour", "day_of_month", "month", "day_of_week")


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A validated five-field cron expression.

    ``expression`` is the normalised five-field text (macros expanded, single spaces), the form
    to iterate with croniter. ``fields`` are the five raw field texts. ``minutes``/``hours`` are
    the expanded sets (``None`` when the field is ``*``), which the DST rules need: a fixed hour
    in a repeated hour fires once, a wildcard/stepped hour fires by the clock through both copies.
    """

    expression: str
    fields: tuple[str, str, str, str, str]
    minutes: tuple[int, ...] | None = field(default=None)
    hours: tuple[int, ...] | None = field(default=None)

    @property
    def hour_is_wildcard(self) -> bool:
        """True when the hour field is ``*`` or a step over the whole day (``*/2``)."""
        return self.fields[1] == "*" or self.fields[1].startswith("*/")


def parse_cron(expression: str) -> CronSchedule:
    """Validate ``expression`` and return its parsed form.

    Raises :class:`ValidationError` (field ``cron``) for anything that is not exactly five
    fields, that croniter rejects, or that can never fire (e.g. ``0 0 30 2 *``).
    """
    if not isinstance(expression, str):
        raise ValidationError("cron", f"expected a string, got {type(expression).__name__}")
    text = " ".join(expression.split())
    text = MACROS.get(text.lower(), text)
    parts = text.split(" ")
    if not text or len(parts) != 5:
        raise ValidationError(
            "cron",
            f"{expression!r} has {len(parts) if text else 0} fields; expected 5 "
            "(minute hour day-of-month month day-of-week), e.g. '*/5 * * * *'",
        )
    if not croniter.is_valid(text):
        raise ValidationError(
            "cron",
            f"{expression!r} is not a valid cron expression; each of the 5 fields "
            "(minute hour day-of-month month day-of-week) must be *, a number in range, "
            "a list a,b, a range a-b or a step */n",
        )
    try:
        it = croniter(text, datetime(2000, 1, 1))
        it.get_next(datetime)
    except (CroniterBadDateError, ValueError, KeyError) as exc:
        raise ValidationError(
            "cron", f"{expression!r} never fires (no matching calendar date): {exc}"
        ) from exc
    expanded = it.expanded
    return CronSchedule(
        expression=text,
        fields=(parts[0], parts[1], parts[2], parts[3], parts[4]),
        minutes=_ints(expanded[0]),
        hours=_ints(expanded[1]),
    )


def _ints(values: list[int | str]) -> tuple[int, ...] | None:
    if any(not isinstance(v, int) for v in values):
        return None
    return tuple(sorted(int(v) for v in values))


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; :class:`ValidationError` (field ``timezone``) if unknown."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValidationError("timezone", f"{name!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValidationError(
            "timezone",
            f"unknown time zone {name!r}; use an IANA name such as 'UTC' or 'Europe/Berlin'",
        ) from exc
