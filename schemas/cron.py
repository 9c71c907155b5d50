"""Cron expressions and time zones: one parser for producers (validation) and the scheduler (fires).

Producers reject a bad expression or zone before anything is sent; the scheduler computes fires
from the same :class:`CronSchedule`, so "valid" means the same thing on both sides of the topic.

Only croniter and zoneinfo are used here. croniter is used for parsing and for iterating *naive
wall-clock* times; its own time-zone arithmetic is not trusted (it has drifted across DST changes
between croniter releases), so mapping wall times to instants is done explicitly.

Cron and daylight saving time (the rules of :meth:`CronSchedule.next_after`)
----------------------------------------------------------------------------
A cron expression describes *wall-clock* times in the job's time zone. Each matching wall time is
mapped to an instant (epoch milliseconds) by these rules, which are those of classic cron
(Vixie cron / cronie):

1. A wall time that exists once fires at that instant.
2. Skipped wall time (spring forward, e.g. 02:30 on 2026-03-08 in America/New_York, where clocks
   jump from 02:00 EST to 03:00 EDT): the job fires once, at the instant the gap ends
   (03:00 EDT). Several skipped wall times collapse into that single fire, and a wall time that
   itself falls exactly on the end of the gap (03:00) is not fired a second time.
3. Repeated wall time (fall back, e.g. 01:30 on 2026-11-01 in America/New_York, which happens at
   01:30 EDT and again at 01:30 EST):
   - if the cron's minute or hour field starts with ``*`` (``*``, ``*/15``; e.g.
     ``*/30 * * * *``, ``0 * * * *``, ``@hourly``) the job runs by the clock and fires at BOTH
     occurrences, so it keeps firing every real 30 minutes / every real hour;
   - otherwise (a fixed minute and hour, e.g. ``30 1 * * *``, ``@daily``) it fires once, at the
     FIRST occurrence (01:30 EDT).
4. Fires are strictly increasing instants: ``next_after(t)`` is the smallest fire instant
   strictly greater than ``t``, so no instant is ever returned twice.

Zones whose offset moves by 30 minutes (Australia/Lord_Howe) follow the same rules with a
30-minute gap or repeat; zones without DST (Asia/Kolkata, UTC) have neither. The macros
(``@hourly``, ``@daily``, ``@midnight``, ``@weekly``, ``@monthly``, ``@yearly``/``@annually``) are
their five-field forms and follow the rules of those forms. Day-of-month and day-of-week follow
cron's "either matches" rule when both are restricted (croniter's default).
"""

from __future__ import annotations

import threading
import zoneinfo
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from jobwheel.errors import ValidationError, clip

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

#: Longer expressions are refused before croniter sees them (a list of every minute is ~170).
MAX_EXPRESSION_CHARS = 256

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

    @property
    def fires_by_clock(self) -> bool:
        """True when the minute or hour field starts with ``*``: cronie's "wildcard job".

        Such a job fires at both occurrences of a repeated wall time (DST rule 3 above);
        a job with a fixed minute and hour fires only at the first.
        """
        return self.fields[0].startswith("*") or self.fields[1].startswith("*")

    def next_after(self, after_ms: int, tz: ZoneInfo) -> int:
        """The first fire instant (epoch ms) strictly after ``after_ms`` in zone ``tz``.

        Implements the DST rules in this module's docstring: croniter only walks naive wall
        times; every wall time is mapped to instants here. Cost: one croniter step (~30 us) in
        the common case; a few dozen steps once a year when ``after_ms`` lies in a repeated hour.
        """
        by_clock = self.fires_by_clock
        local = datetime.fromtimestamp(after_ms // 1000, tz)
        start = local.replace(tzinfo=None)
        if local.fold == 0:
            later = local.replace(fold=1).utcoffset()
            earlier = local.utcoffset()
            if later is not None and earlier is not None and later < earlier:
                # ``after`` lies in the first pass of a repeated hour: wall times up to one shift
                # earlier still have a second occurrence after it.
                start -= earlier - later
        walls = _walker(self.expression)
        walls.set_current(start, force=True)
        best: int | None = None
        for _ in range(_MAX_STEPS):
            wall = walls.get_next(datetime)
            instants = _wall_instants(wall, tz, by_clock)
            if best is not None and instants[0] >= best:
                break
            for instant in instants:
                if instant > after_ms and (best is None or instant < best):
                    best = instant
            if instants[0] > after_ms:
                # Every later wall time maps to instants >= this one (the mapping is monotonic).
                break
        if best is None:
            raise ValueError(f"cron {self.expression!r}: no fire found after {after_ms}")
        return best

    def last_at_or_before(self, until_ms: int, tz: ZoneInfo) -> int:
        """The latest fire instant (epoch ms) at or before ``until_ms``; same rules as above.

        The mirror image of :meth:`next_after`, walking wall times backwards, so that "the most
        recent missed fire" costs a step or two however long the scheduler was down.
        """
        by_clock = self.fires_by_clock
        local = datetime.fromtimestamp(until_ms // 1000, tz)
        start = local.replace(tzinfo=None)
        if local.fold == 1:
            earlier = local.replace(fold=0).utcoffset()
            later = local.utcoffset()
            if earlier is not None and later is not None and earlier > later:
                # ``until`` lies in the second pass of a repeated hour: the first occurrences of
                # wall times up to one shift later are still before it.
                start += earlier - later
        walls = _walker(self.expression)
        walls.set_current(start + timedelta(seconds=1), force=True)
        best: int | None = None
        for _ in range(_MAX_STEPS):
            wall = walls.get_prev(datetime)
            instants = _wall_instants(wall, tz, by_clock)
            if best is not None and instants[-1] <= best:
                break
            for instant in instants:
                if instant <= until_ms and (best is None or instant > best):
                    best = instant
            if instants[-1] <= until_ms:
                # Every earlier wall time maps to instants <= this one.
                break
        if best is None:
            raise ValueError(f"cron {self.expression!r}: no fire found before {until_ms}")
        return best


def parse_cron(expression: str) -> CronSchedule:
    """Validate ``expression`` and return its parsed form.

    Raises :class:`ValidationError` (field ``cron``) for anything that is not exactly five
    fields, that croniter rejects, or that can never fire (e.g. ``0 0 30 2 *``).
    """
    if not isinstance(expression, str):
        raise ValidationError("cron", f"expected a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValidationError(
            "cron",
            f"{clip(expression)} is {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}",
        )
    text = " ".join(expression.split())
    text = MACROS.get(text.lower(), text)
    parts = text.split(" ")
    if not text or len(parts) != 5:
        raise ValidationError(
            "cron",
            f"{clip(expression)} has {len(parts) if text else 0} fields; expected 5 "
            "(minute hour day-of-month month day-of-week), e.g. '*/5 * * * *'",
        )
    if not croniter.is_valid(text):
        raise ValidationError(
            "cron",
            f"{clip(expression)} is not a valid cron expression; each of the 5 fields "
            "(minute hour day-of-month month day-of-week) must be *, a number in range, "
            "a list a,b, a range a-b or a step */n",
        )
    try:
        it = croniter(text, datetime(2000, 1, 1))
        it.get_next(datetime)
    except (CroniterBadDateError, ValueError, KeyError, OverflowError) as exc:
        raise ValidationError(
            "cron", f"{clip(expression)} never fires (no matching calendar date): {exc}"
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
        raise ValidationError("timezone", f"{clip(name)} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValidationError(
            "timezone",
            f"unknown time zone {clip(name)}; use an IANA name such as 'UTC' or 'Europe/Berlin'",
        ) from exc


# --- wall time -> instant ------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)
_SECOND_MS = 1000
_MAX_STEPS = 10_000
_walkers = threading.local()


def _walker(expression: str) -> croniter:
    """A croniter for ``expression``, reused per thread: building one costs ~80 us, reusing ~30.

    Per thread because a croniter is a mutable cursor (``set_current``/``get_next``).
    """
    cache: dict[str, croniter] | None = getattr(_walkers, "cache", None)
    if cache is None:
        cache = _walkers.cache = {}
    walker = cache.get(expression)
    if walker is None:
        if len(cache) >= 4096:
            cache.clear()
        walker = cache[expression] = croniter(expression, _EPOCH)
    return walker


def _wall_instants(wall: datetime, tz: ZoneInfo, both_folds: bool) -> tuple[int, ...]:
    """The instants (epoch ms, ascending) at which naive wall time ``wall`` fires in ``tz``."""
    first = wall.replace(tzinfo=tz).utcoffset()
    second = wall.replace(tzinfo=tz, fold=1).utcoffset()
    assert first is not None and second is not None
    if first == second:
        return ((wall - first - _EPOCH) // _MS,)
    if first > second:
        # Repeated wall time: fold=0 is the first occurrence (the earlier, larger offset).
        earlier = (wall - first - _EPOCH) // _MS
        if both_folds:
            return earlier, (wall - second - _EPOCH) // _MS
        return (earlier,)
    # Skipped wall time: ``first`` is the offset before the jump, ``second`` the one after.
    return (_gap_end_ms(tz, (wall - second - _EPOCH) // _MS, (wall - first - _EPOCH) // _MS),)


def _gap_end_ms(tz: ZoneInfo, before_ms: int, after_ms: int) -> int:
    """The transition instant in ``(before_ms, after_ms]`` where ``tz``'s offset jumps forward.

    zoneinfo has no public transition list, so bisect on whole seconds (tz transitions are on
    whole seconds): about 12 offset lookups, and only for wall times that do not exist.
    """
    low = before_ms // _SECOND_MS  # offset here is the one before the jump
    high = -(-after_ms // _SECOND_MS)  # offset here is the one after
    old = datetime.fromtimestamp(low, tz).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).utcoffset() == old:
            low = middle
        else:
            high = middle
    return high * _SECOND_MS
