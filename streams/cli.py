"""Subcommands of the ``jobwheel`` CLI that belong to ``streams``: ``scheduler`` and ``next``.

``jobwheel next`` answers "when will this fire?" with the scheduler's own calculation
(:mod:`jobwheel.streams.triggers`), so what it prints is what the scheduler will do, DST rules
included:

    jobwheel next --cron "30 2 * * *" --tz America/New_York --from 2026-03-07T12:00:00-05:00
    jobwheel next --every 90m --count 3

Durations and instants are parsed by the same functions as ``jobwheel submit``
(:mod:`jobwheel.schemas.timetext`, the one grammar of every part).
"""

from __future__ import annotations

import argparse
import importlib
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from jobwheel import extras
from jobwheel.errors import ConfigError, ValidationError
from jobwheel.settings import get_settings

MAX_COUNT = 10_000
_MS = timedelta(milliseconds=1)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this package's subcommands; each sets ``handler=`` to a function of the args."""
    scheduler = sub.add_parser(
        "scheduler",
        help="run a scheduler instance (exactly-once stream processor owning request partitions)",
        description="Run one scheduler instance until SIGTERM/SIGINT. Configure it with "
        "JOBWHEEL_* environment variables (bootstrap servers, data dir, group protocol, ...).",
    )
    scheduler.set_defaults(handler=_scheduler)

    nxt = sub.add_parser(
        "next",
        help="print the next fire times of a cron or interval schedule",
        description="Print the next fire instants of a schedule, computed exactly as the "
        "scheduler computes them (cron in a time zone with its DST rules, or a fixed interval).",
    )
    kind = nxt.add_mutually_exclusive_group(required=True)
    kind.add_argument("--cron", metavar="EXPR", help="five-field cron expression or @hourly etc.")
    kind.add_argument("--every", metavar="DURATION", help="interval, e.g. 90m, 1h30m, 250ms")
    nxt.add_argument("--tz", metavar="ZONE", help="IANA time zone of --cron (default UTC)")
    nxt.add_argument(
        "--from",
        dest="from_",
        metavar="ISO8601",
        help="start instant with offset, e.g. 2026-03-07T12:00:00-05:00 (default: now); "
        "the first fire printed is strictly after it for --cron, one interval after it for --every",
    )
    nxt.add_argument("--count", default="5", metavar="N", help="how many fires (default 5)")
    nxt.set_defaults(handler=_next)


def _scheduler(args: argparse.Namespace) -> int:
    try:
        app = importlib.import_module("jobwheel.streams.app")
    except ModuleNotFoundError as exc:
        if exc.name == "jobwheel.streams.app":
            raise ConfigError(
                "the scheduler application (streams/app.py) is not part of this build; "
                "install a complete jobwheel"
            ) from exc
        raise ConfigError(
            extras.missing_message("scheduler", exc)
            or f"cannot start the scheduler: module {exc.name!r} is missing; reinstall jobwheel "
            f"with its scheduler extra ({extras.install_hint('scheduler')})"
        ) from exc
    run = getattr(app, "run_scheduler", None)
    if run is None:
        raise ConfigError(
            "jobwheel.streams.app has no run_scheduler(settings); this build is incomplete"
        )
    return int(run(get_settings()) or 0)


def _next(args: argparse.Namespace) -> int:
    for line in next_fires(
        cron=args.cron, tz=args.tz, every=args.every, start=args.from_, count=args.count
    ):
        print(line)
    return 0


def next_fires(
    *,
    cron: str | None = None,
    tz: str | None = None,
    every: str | None = None,
    start: str | None = None,
    count: Any = 5,
) -> list[str]:
    """The lines ``jobwheel next`` prints: ISO 8601 instants with the offset of the job's zone.

    Raises :class:`ValidationError` for a bad expression, zone, duration, instant or count.
    """
    from jobwheel.schemas.cron import zone
    from jobwheel.schemas.models import Cron, Every, Trigger
    from jobwheel.schemas.timetext import parse_duration, parse_instant
    from jobwheel.streams import triggers

    n = _count(count)
    start_ms = _now_ms() if start is None else int(parse_instant(start, "from").timestamp() * 1000)
    trigger: Trigger
    shown_in: tzinfo
    if cron is not None:
        shown_in = zone(tz or "UTC")
        trigger = Cron(cron, tz or "UTC")
    elif every is not None:
        if tz is not None:
            raise ValidationError(
                "tz", "applies to --cron only; an --every interval ignores zones (shown in UTC)"
            )
        shown_in = UTC
        interval = parse_duration(every, "every")
        trigger = Every(interval // _MS)
    else:
        raise ValidationError("schedule", "give --cron EXPR (with --tz ZONE) or --every DURATION")
    fires = [triggers.first_fire_ms(trigger, start_ms)]
    while len(fires) < n:
        nxt = triggers.next_fire_ms(trigger, fires[-1])
        if nxt is None:
            break
        fires.append(nxt)
    return [_iso(ms, shown_in) for ms in fires]


def _count(value: Any) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= MAX_COUNT:
        raise ValidationError("count", f"{value!r}; give a whole number from 1 to {MAX_COUNT}")
    return n


def _iso(instant_ms: int, tz: tzinfo) -> str:
    seconds, millis = divmod(instant_ms, 1000)
    local = datetime.fromtimestamp(seconds, tz)
    if millis:
        return local.replace(microsecond=millis * 1000).isoformat(timespec="milliseconds")
    return local.isoformat(timespec="seconds")


def _now_ms() -> int:
    from jobwheel.clock import SystemClock

    return SystemClock().now_ms()
