"""When a job fires: the one calculation shared by the scheduler and ``jobwheel next``.

Pure functions of a trigger (``jobwheel.schemas.models``) and epoch milliseconds; no clock is read
here.

- ``Now``/``At``/``After`` fire once: at ``issued_at``, at ``at_ms``, at ``issued_at + delay``.
- ``Every`` fires at ``start_at_ms`` (or ``issued_at + interval``) and then every ``interval``
  after the previous SCHEDULED instant: real elapsed time, blind to DST and wall-clock shifts, and
  never drifting with dispatch lateness.
- ``Cron`` fires at the wall-clock times of its expression in its time zone, mapped to instants by
  the DST rules documented in :mod:`jobwheel.schemas.cron` (skipped time fires once when the gap
  ends; repeated time fires twice only for a wildcard minute/hour). Each fire is strictly after the
  previous one.

Parsed cron expressions and zones are cached (the scheduler asks for every fire of every job).
"""

from __future__ import annotations

import functools
from zoneinfo import ZoneInfo

from jobwheel.errors import ValidationError
from jobwheel.schemas.cron import CronSchedule, parse_cron, zone
from jobwheel.schemas.models import After, At, Cron, Every, Now, Trigger


@functools.lru_cache(maxsize=4096)
def _cron(expression: str, timezone: str) -> tuple[CronSchedule, ZoneInfo]:
    return parse_cron(expression), zone(timezone)


def _interval(trigger: Every) -> int:
    if trigger.interval_ms <= 0:
        raise ValidationError(
            "trigger.interval_ms", f"{trigger.interval_ms} ms; an interval must be > 0"
        )
    return trigger.interval_ms


def first_fire_ms(trigger: Trigger, issued_at_ms: int) -> int:
    """The first instant the job fires, for a request issued at ``issued_at_ms``.

    A cron job's first fire is strictly after ``issued_at_ms``: a job submitted at 09:00:00 for
    ``0 9 * * *`` next fires tomorrow, as with crontab.
    """
    if isinstance(trigger, Now):
        return issued_at_ms
    if isinstance(trigger, At):
        return trigger.at_ms
    if isinstance(trigger, After):
        return issued_at_ms + trigger.delay_ms
    if isinstance(trigger, Every):
        interval = _interval(trigger)
        return trigger.start_at_ms if trigger.start_at_ms is not None else issued_at_ms + interval
    if isinstance(trigger, Cron):
        schedule, tz = _cron(trigger.expression, trigger.timezone)
        return schedule.next_after(issued_at_ms, tz)
    raise TypeError(f"unknown trigger type {type(trigger).__name__}")


def next_fire_ms(trigger: Trigger, previous_fire_ms: int) -> int | None:
    """The fire after the one scheduled at ``previous_fire_ms``; None for one-shot triggers."""
    if isinstance(trigger, Every):
        return previous_fire_ms + _interval(trigger)
    if isinstance(trigger, Cron):
        schedule, tz = _cron(trigger.expression, trigger.timezone)
        return schedule.next_after(previous_fire_ms, tz)
    if isinstance(trigger, Now | At | After):
        return None
    raise TypeError(f"unknown trigger type {type(trigger).__name__}")


def last_fire_between(trigger: Trigger, after_ms: int, until_ms: int) -> int | None:
    """The last fire after ``after_ms`` up to ``until_ms`` inclusive (``next_fire_ms`` from
    ``after_ms`` again and again, the last one), or None when there is none; for an ``Every``
    trigger ``after_ms`` should be one of its fire instants.

    Constant work for ``Every`` (arithmetic) and one or two wall-clock steps for ``Cron``
    (walking backwards from ``until_ms``), so a scheduler that was down for a month does not
    iterate a month of per-minute fires to find the one it should run.
    """
    if until_ms <= after_ms:
        return None
    if isinstance(trigger, Every):
        interval = _interval(trigger)
        count = (until_ms - after_ms) // interval
        return after_ms + interval * count if count else None
    if isinstance(trigger, Cron):
        schedule, tz = _cron(trigger.expression, trigger.timezone)
        last = schedule.last_at_or_before(until_ms, tz)
        return last if last > after_ms else None
    if isinstance(trigger, Now | At | After):
        return None
    raise TypeError(f"unknown trigger type {type(trigger).__name__}")
