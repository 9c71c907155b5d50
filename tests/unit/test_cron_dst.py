"""Cron across daylight saving time: the rules documented in ``jobwheel.schemas.cron``.

Expected instants are written by hand as ISO 8601 with the offset in force (2026 transitions:
America/New_York 03-08 02:00 EST->03:00 EDT and 11-01 02:00 EDT->01:00 EST; Europe/Berlin 03-29
02:00 CET->03:00 CEST and 10-25 03:00 CEST->02:00 CET; Australia/Lord_Howe 04-05 02:00 +11->01:30
+10:30 and 10-04 02:00 +10:30->02:30 +11; Asia/Kolkata and UTC never change).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from jobwheel.schemas.cron import parse_cron, zone


def ms(iso: str) -> int:
    dt = datetime.fromisoformat(iso)
    assert dt.tzinfo is not None, iso
    return int(dt.timestamp() * 1000)


def utc(instant_ms: int) -> str:
    return datetime.fromtimestamp(instant_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fires(expr: str, tz: str, after_iso: str, count: int) -> list[str]:
    schedule, zi = parse_cron(expr), zone(tz)
    out, t = [], ms(after_iso)
    for _ in range(count):
        t = schedule.next_after(t, zi)
        out.append(utc(t))
    return out


def expect(*isos: str) -> list[str]:
    return [utc(ms(s)) for s in isos]


CASES = [
    # --- America/New_York, spring forward 2026-03-08 -------------------------------------
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00:00-05:00",
        ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"],
        id="ny-spring-fixed-time-in-gap-fires-at-gap-end",
    ),
    pytest.param(
        "15,45 2 * * *",
        "America/New_York",
        "2026-03-08T00:00:00-05:00",
        ["2026-03-08T03:00:00-04:00", "2026-03-09T02:15:00-04:00", "2026-03-09T02:45:00-04:00"],
        id="ny-spring-two-skipped-times-collapse-into-one",
    ),
    pytest.param(
        "0,30 2-3 * * *",
        "America/New_York",
        "2026-03-08T00:00:00-05:00",
        ["2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00", "2026-03-09T02:00:00-04:00"],
        id="ny-spring-fire-exactly-at-gap-end-not-doubled",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        "2026-03-08T01:00:00-05:00",
        [
            "2026-03-08T01:30:00-05:00",
            "2026-03-08T03:00:00-04:00",
            "2026-03-08T03:30:00-04:00",
            "2026-03-08T04:00:00-04:00",
        ],
        id="ny-spring-every-30-min-by-the-clock",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-03-08T00:30:00-05:00",
        ["2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T04:00:00-04:00"],
        id="ny-spring-hourly",
    ),
    pytest.param(
        "30 2 * * 0",
        "America/New_York",
        "2026-03-01T03:00:00-05:00",
        ["2026-03-08T03:00:00-04:00", "2026-03-15T02:30:00-04:00"],
        id="ny-spring-day-of-week",
    ),
    pytest.param(
        "30 2 8 3 *",
        "America/New_York",
        "2026-01-01T00:00:00-05:00",
        # 2027's change is on 03-14, so 03-08 02:30 exists (EST) next year.
        ["2026-03-08T03:00:00-04:00", "2027-03-08T02:30:00-05:00"],
        id="ny-spring-day-of-month",
    ),
    # --- America/New_York, fall back 2026-11-01 ------------------------------------------
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00:00-04:00",
        ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00", "2026-11-03T01:30:00-05:00"],
        id="ny-fall-fixed-time-fires-once-first-occurrence",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T01:15:00-05:00",
        ["2026-11-02T01:30:00-05:00"],
        id="ny-fall-fixed-time-not-again-in-second-pass",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        "2026-11-01T00:45:00-04:00",
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:30:00-04:00",
            "2026-11-01T01:00:00-05:00",
            "2026-11-01T01:30:00-05:00",
            "2026-11-01T02:00:00-05:00",
        ],
        id="ny-fall-every-30-min-fires-both-occurrences",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        "2026-11-01T01:45:00-04:00",
        ["2026-11-01T01:00:00-05:00", "2026-11-01T01:30:00-05:00", "2026-11-01T02:00:00-05:00"],
        id="ny-fall-from-inside-first-pass",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-11-01T00:30:00-04:00",
        ["2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"],
        id="ny-fall-hourly-every-real-hour",
    ),
    pytest.param(
        "@hourly",
        "America/New_York",
        "2026-11-01T00:30:00-04:00",
        ["2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"],
        id="ny-fall-at-hourly-macro-is-a-wildcard-hour",
    ),
    pytest.param(
        "*/20 1 1 11 *",
        "America/New_York",
        "2026-10-31T00:00:00-04:00",
        # Wildcard minute, fixed hour: still "by the clock" (cronie: minute OR hour starts with *).
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:20:00-04:00",
            "2026-11-01T01:40:00-04:00",
            "2026-11-01T01:00:00-05:00",
            "2026-11-01T01:20:00-05:00",
            "2026-11-01T01:40:00-05:00",
            "2027-11-01T01:00:00-04:00",
        ],
        id="ny-fall-wildcard-minute-day-of-month",
    ),
    pytest.param(
        "30 1 * * SUN",
        "America/New_York",
        "2026-10-26T00:00:00-04:00",
        ["2026-11-01T01:30:00-04:00", "2026-11-08T01:30:00-05:00"],
        id="ny-fall-day-of-week-name",
    ),
    pytest.param(
        "@daily",
        "America/New_York",
        "2026-10-31T12:00:00-04:00",
        ["2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00"],
        id="ny-fall-at-daily",
    ),
    # --- Europe/Berlin ---------------------------------------------------------------------
    pytest.param(
        "30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T12:00:00+01:00",
        ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
        id="berlin-spring-fixed-time-in-gap",
    ),
    pytest.param(
        "*/15 2 * * *",
        "Europe/Berlin",
        "2026-03-29T00:00:00+01:00",
        ["2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00", "2026-03-30T02:15:00+02:00"],
        id="berlin-spring-whole-skipped-hour-collapses",
    ),
    pytest.param(
        "30 2 * * 0",
        "Europe/Berlin",
        "2026-03-23T00:00:00+01:00",
        ["2026-03-29T03:00:00+02:00", "2026-04-05T02:30:00+02:00"],
        id="berlin-spring-day-of-week",
    ),
    pytest.param(
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T12:00:00+02:00",
        ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
        id="berlin-fall-fixed-time-once",
    ),
    pytest.param(
        "0,30 * * * *",
        "Europe/Berlin",
        "2026-10-25T01:45:00+02:00",
        # Minute is a list, but the hour starts with *: both occurrences.
        [
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T02:30:00+01:00",
            "2026-10-25T03:00:00+01:00",
        ],
        id="berlin-fall-wildcard-hour",
    ),
    pytest.param(
        "0 2 * * SUN",
        "Europe/Berlin",
        "2026-10-20T00:00:00+02:00",
        ["2026-10-25T02:00:00+02:00", "2026-11-01T02:00:00+01:00"],
        id="berlin-fall-day-of-week",
    ),
    # --- Australia/Lord_Howe (30-minute shift) -------------------------------------------
    pytest.param(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T12:00:00+11:00",
        ["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"],
        id="lordhowe-fall-fixed-time-once",
    ),
    pytest.param(
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-04-05T01:20:00+11:00",
        [
            "2026-04-05T01:30:00+11:00",
            "2026-04-05T01:45:00+11:00",
            "2026-04-05T01:30:00+10:30",
            "2026-04-05T01:45:00+10:30",
            "2026-04-05T02:00:00+10:30",
        ],
        id="lordhowe-fall-every-15-min-both-occurrences",
    ),
    pytest.param(
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00:00+10:30",
        ["2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"],
        id="lordhowe-spring-fixed-time-in-gap",
    ),
    pytest.param(
        "*/20 * * * *",
        "Australia/Lord_Howe",
        "2026-10-04T01:30:00+10:30",
        ["2026-10-04T01:40:00+10:30", "2026-10-04T02:30:00+11:00", "2026-10-04T02:40:00+11:00"],
        id="lordhowe-spring-every-20-min",
    ),
    pytest.param(
        "0 2 4 10 *",
        "Australia/Lord_Howe",
        "2026-01-01T00:00:00+11:00",
        # 2027's change is on 10-03, so 10-04 02:00 exists (in daylight time) next year.
        ["2026-10-04T02:30:00+11:00", "2027-10-04T02:00:00+11:00"],
        id="lordhowe-spring-day-of-month",
    ),
    # --- no DST ----------------------------------------------------------------------------
    pytest.param(
        "30 2 * * *",
        "Asia/Kolkata",
        "2026-03-07T12:00:00+05:30",
        ["2026-03-08T02:30:00+05:30", "2026-03-09T02:30:00+05:30"],
        id="kolkata-no-dst-spring",
    ),
    pytest.param(
        "*/30 1 * * *",
        "Asia/Kolkata",
        "2026-11-01T00:00:00+05:30",
        ["2026-11-01T01:00:00+05:30", "2026-11-01T01:30:00+05:30", "2026-11-02T01:00:00+05:30"],
        id="kolkata-no-dst-fall",
    ),
    pytest.param(
        "0 * * * *",
        "UTC",
        "2026-03-08T01:30:00+00:00",
        ["2026-03-08T02:00:00+00:00", "2026-03-08T03:00:00+00:00"],
        id="utc-spring",
    ),
    pytest.param(
        "30 1 * * *",
        "UTC",
        "2026-10-31T12:00:00+00:00",
        ["2026-11-01T01:30:00+00:00", "2026-11-02T01:30:00+00:00"],
        id="utc-fall",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), CASES)
def test_next_after_follows_the_dst_rules(
    expr: str, tz: str, after: str, expected: list[str]
) -> None:
    assert fires(expr, tz, after, len(expected)) == expect(*expected)


def test_next_after_is_strictly_after_a_fire_instant() -> None:
    schedule, tz = parse_cron("30 2 * * *"), zone("UTC")
    at_fire = ms("2026-05-01T02:30:00+00:00")
    assert schedule.next_after(at_fire, tz) == ms("2026-05-02T02:30:00+00:00")
    assert schedule.next_after(at_fire - 1, tz) == at_fire


def test_next_after_sub_second_input() -> None:
    schedule, tz = parse_cron("* * * * *"), zone("Europe/Berlin")
    t = ms("2026-05-01T10:00:00+02:00")
    assert schedule.next_after(t + 999, tz) == t + 60_000
    assert schedule.next_after(t - 1, tz) == t


ZONES = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"]


@pytest.mark.parametrize("tz", ZONES)
def test_every_30_minutes_is_every_30_real_minutes_around_each_change(tz: str) -> None:
    # Two days around each of 2026's changes (or the same dates where there are none).
    schedule, zi = parse_cron("*/30 * * * *"), zone(tz)
    for start in (
        "2026-03-07",
        "2026-03-28",
        "2026-04-04",
        "2026-10-03",
        "2026-10-24",
        "2026-10-31",
    ):
        t = ms(f"{start}T00:00:00+00:00")
        for _ in range(2 * 48):
            nxt = schedule.next_after(t, zi)
            assert nxt - t == 30 * 60_000, (tz, utc(t), utc(nxt))
            t = nxt


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("expr", ["30 1 * * *", "30 2 * * *", "15 2 * * *", "45 1 * * *"])
def test_fixed_daily_time_fires_once_on_every_local_date_of_2026(expr: str, tz: str) -> None:
    schedule, zi = parse_cron(expr), ZoneInfo(tz)
    t = ms("2025-12-31T12:00:00+00:00")
    dates: list[date] = []
    while True:
        t = schedule.next_after(t, zi)
        local = datetime.fromtimestamp(t / 1000, zi)
        if local.year > 2026:
            break
        if local.year == 2026:
            dates.append(local.date())
    assert dates == [date(2026, 1, 1) + timedelta(days=i) for i in range(365)]


@pytest.mark.parametrize("tz", ZONES)
def test_last_at_or_before_mirrors_next_after(tz: str) -> None:
    # For every fire f: last_at_or_before(f) == f and last_at_or_before(next(f) - 1) == f.
    zi = zone(tz)
    for expr in ("*/30 * * * *", "30 1 * * *", "30 2 * * *", "0 * * * *"):
        schedule = parse_cron(expr)
        for start in ("2026-03-07", "2026-03-28", "2026-04-04", "2026-10-03", "2026-10-24"):
            t = schedule.next_after(ms(f"{start}T00:00:00+00:00"), zi)
            for _ in range(60):
                nxt = schedule.next_after(t, zi)
                assert schedule.last_at_or_before(t, zi) == t, (expr, tz, utc(t))
                assert schedule.last_at_or_before(nxt - 1, zi) == t, (expr, tz, utc(t))
                t = nxt


def test_fixed_time_is_not_a_wildcard_and_macros_follow_their_five_field_form() -> None:
    assert parse_cron("*/30 * * * *").fires_by_clock
    assert parse_cron("0 * * * *").fires_by_clock
    assert parse_cron("*/5 1 * * *").fires_by_clock
    assert parse_cron("@hourly").fires_by_clock
    assert not parse_cron("30 1 * * *").fires_by_clock
    assert not parse_cron("0-59/30 1 * * *").fires_by_clock
    assert not parse_cron("@daily").fires_by_clock
