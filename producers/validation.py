"""The text and SDK forms of a job request, turned into values the contract rules check.

The rules of a complete command (job id, task name, args, triggers, limits) live in
:mod:`jobwheel.schemas.validation`, shared with the scheduler so that "valid" means the same on both
sides of the requests topic. This module holds what only producers need: the SDK's keyword
form (datetimes and timedeltas, :func:`trigger`) and the text forms of the CLI and the HTTP API
(:func:`duration_ms`; the options themselves are :mod:`jobwheel.producers.spec`, the grammar
of durations and instants :mod:`jobwheel.schemas.timetext`). Every failure is a
:class:`jobwheel.errors.ValidationError` naming the field, with long values cut.

The functions are pure: "now" is an argument, so the same rules check a request built by hand.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from jobwheel.errors import ValidationError, clip
from jobwheel.schemas import validation as rules
from jobwheel.schemas.models import After, At, Every, Now, Trigger

# The one grammar of durations and instants (:mod:`jobwheel.schemas.timetext`), under the names
# the CLI and the API have always called here.
from jobwheel.schemas.timetext import DURATION_EXAMPLES, duration_value, instant_value_ms
from jobwheel.schemas.timetext import aware_ms as aware_ms
from jobwheel.schemas.timetext import parse_duration as parse_duration
from jobwheel.schemas.timetext import parse_instant as parse_instant

MAX_PAST = timedelta(milliseconds=rules.MAX_PAST_MS)


def trigger(
    *,
    now: bool = False,
    at: datetime | str | None = None,
    in_: timedelta | str | None = None,
    every: timedelta | str | None = None,
    cron: str | None = None,
    tz: str = "UTC",
    start_at: datetime | str | None = None,
    now_ms: int,
) -> Trigger:
    """Exactly one of now/at/in_/every/cron, checked and turned into a trigger model. Times
    are aware datetimes or ISO 8601 text with an offset, durations timedeltas or duration
    text (``5s``): one grammar with the CLI (:mod:`jobwheel.schemas.timetext`)."""
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
        return At(rules.not_too_old(instant_value_ms(at, "at"), now_ms))
    if in_ is not None:
        return After(rules.positive_ms(duration_value(in_, "in"), "in"))  # type: ignore[arg-type]
    if every is not None:
        interval = rules.every_ms(duration_value(every, "every"))  # type: ignore[arg-type]
        first = None
        if start_at is not None:
            first = rules.not_too_old(instant_value_ms(start_at, "start_at"), now_ms, "start_at")
        return Every(interval, first)  # type: ignore[arg-type]
    return rules.cron(cron, tz)


# --- text forms (CLI, HTTP) -----------------------------------------------------------------


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
        f"must be a duration like {DURATION_EXAMPLES} or whole milliseconds, got {clip(value)}",
    )
