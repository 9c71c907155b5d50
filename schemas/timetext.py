"""The one grammar of durations and instants written as text, for every part that reads them:
``jobwheel submit``/``next`` and the API's schedule fields, the status filters (``--since``,
``?since=``, the console) and ``jobwheel dlq``.

- A duration is one or more ``<whole number><unit>`` with no spaces, units ``ms``, ``s``, ``m``,
  ``h``, ``d`` (24 h) and ``w`` (7 d), summed: ``250ms``, ``5s``, ``1h30m``, ``2w``. These are
  elapsed time, never calendar arithmetic (a day is 24 hours across a DST change too).
- An instant is ISO 8601 *with* an offset or ``Z``: ``2030-01-01T09:00:00+01:00``,
  ``2030-01-01T08:00:00Z``. A time without one is refused everywhere, with the fix in the
  message: whether it meant UTC or the reader's wall clock cannot be known, and guessing
  would schedule a job (or cut a filter) hours off.
- Where a point in time is a filter (:func:`instant_ms`), it may also be epoch milliseconds or
  an age: a duration meaning "that long before now" (``--since 2h``).
- The SDK takes a point in time as an aware ``datetime`` or as the same text
  (:func:`instant_value_ms`), and a duration as a ``timedelta`` or the same text
  (:func:`duration_value`), so ``at="2030-01-01T09:00:00+01:00"`` or ``in_="5s"`` mean there
  what they mean to ``jobwheel submit``.

Pure: "now" is an argument. Every failure is a :class:`~jobwheel.errors.ValidationError`
naming the field.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Any

from jobwheel.errors import ValidationError, clip
from jobwheel.schemas import validation as rules

#: Longer duration or instant texts are refused before parsing (int() of 5,000 digits raises).
MAX_TEXT_CHARS = 64
UNIT_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
}
_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w)", re.ASCII)
_EPOCH = re.compile(r"-?[0-9]{1,19}", re.ASCII)
DURATION_EXAMPLES = "250ms, 5s, 10m, 1h30m, 2d, 1w"
INSTANT_EXAMPLE = "2030-01-01T09:00:00+01:00"


def duration_text_ms(text: Any, field: str) -> int:
    """The milliseconds of a duration text (0 or more): the grammar only, no field limits."""
    if not isinstance(text, str):
        raise ValidationError(field, f"must be a duration like 5s, got {type(text).__name__}")
    compact = text.strip().lower()
    if (
        not compact
        or len(compact) > MAX_TEXT_CHARS
        or "".join(m.group(0) for m in _PART.finditer(compact)) != compact
    ):
        raise ValidationError(
            field, f"{clip(text)} is not a duration; use e.g. {DURATION_EXAMPLES}"
        )
    return sum(int(n) * UNIT_MS[unit] for n, unit in _PART.findall(compact))


#: The units a duration is written back in, largest first. Weeks are left out: "2528d" reads
#: at once, "361w1d" needs arithmetic.
_WRITE_UNITS = ("d", "h", "m", "s", "ms")


def duration_text(ms: int, parts: int = 2) -> str:
    """``ms`` written in this grammar, for messages: its largest unit and the ``parts - 1``
    below it, the rest dropped (``2528d8h``, ``1h``, ``1m30s``, ``250ms``), so it reads as
    what a user would type, and pasted back it parses (never above ``ms``). Not Python's
    ``timedelta`` text (``2528 days, 8:02:37.843000``), which no option accepts."""
    rest = max(0, int(ms))
    words: list[str] = []
    for unit in _WRITE_UNITS:
        count, rest = divmod(rest, UNIT_MS[unit])
        if count:
            words.append(f"{count}{unit}")
        if len(words) == parts or (words and not count):
            break
    return "".join(words) or "0ms"


def parse_duration(text: Any, field: str) -> timedelta:
    """A positive duration no longer than the contract allows (a delay, an interval, a
    timeout)."""
    ms = duration_text_ms(text, field)
    if ms <= 0:
        raise ValidationError(field, f"{clip(text)} must be positive")
    if ms > rules.MAX_DURATION_MS:
        raise ValidationError(field, f"{clip(text)} is too large")
    return timedelta(milliseconds=ms)


def aware_ms(value: Any, field: str) -> int:
    """A time-zone-aware datetime as epoch milliseconds; naive datetimes are ambiguous."""
    if not isinstance(value, datetime):
        raise ValidationError(
            field,
            f"must be an aware datetime or an ISO 8601 time with an offset (e.g. "
            f"{INSTANT_EXAMPLE}), got {type(value).__name__} {clip(value)}",
        )
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
            field, f"{clip(text)} is not an ISO 8601 time; use e.g. {INSTANT_EXAMPLE}"
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


def instant_value_ms(value: Any, field: str) -> int:
    """A point in time given to the SDK, as epoch milliseconds: an aware ``datetime``, or ISO
    8601 text with an offset (:func:`parse_instant`)."""
    if isinstance(value, str):
        value = parse_instant(value, field)
    return aware_ms(value, field)


def duration_value(value: Any, field: str) -> Any:
    """A duration given to the SDK: duration text (``5s``, :func:`parse_duration`) becomes a
    ``timedelta``; anything else is returned for the caller's own checks."""
    return parse_duration(value, field) if isinstance(value, str) else value


def _is_duration(text: str) -> bool:
    compact = text.lower()
    return bool(compact) and "".join(m.group(0) for m in _PART.finditer(compact)) == compact


def instant_ms(value: str | int, field: str, *, now: int) -> int:
    """A point in time of a filter as epoch ms: epoch milliseconds, an instant (as
    :func:`parse_instant`) or an age before ``now`` (``15m``; longer than the epoch means
    "since 1970"). Anything outside 1970..9999 is refused."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValidationError(field, f"must be a time, got {clip(value)}")
    if isinstance(value, int):
        ms = value
    else:
        text = value.strip()
        if len(text) > MAX_TEXT_CHARS:
            ms = None
        elif _EPOCH.fullmatch(text):
            ms = int(text)
        elif _is_duration(text):
            ms = max(0, now - duration_text_ms(text, field))
        else:
            try:
                datetime.fromisoformat(text)
            except ValueError:
                ms = None
            else:
                ms = math.floor(parse_instant(text, field).timestamp() * 1000)
        if ms is None:
            raise ValidationError(
                field,
                f"{clip(value)} is not a time: give epoch milliseconds, an ISO 8601 time with "
                f"an offset ({INSTANT_EXAMPLE}) or an age such as 30s, 15m, 2h, 7d",
            )
    if not 0 <= ms <= rules.MAX_EPOCH_MS:
        raise ValidationError(
            field, f"{clip(value)} is outside 1970..9999 (epoch ms 0..{rules.MAX_EPOCH_MS})"
        )
    return ms
