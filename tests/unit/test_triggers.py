"""Fire-time arithmetic of every trigger type (the scheduler's one calculation)."""

from __future__ import annotations

from datetime import datetime

import pytest

from jobwheel.errors import ValidationError
from jobwheel.schemas.models import After, At, Cron, Every, Now, Trigger
from jobwheel.streams.triggers import first_fire_ms, last_fire_between, next_fire_ms

HOUR = 3_600_000
MINUTE = 60_000


def fires_between(trigger: Trigger, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """The reference the scheduler's shortcuts are checked against: the fires that follow
    ``after_ms`` up to ``until_ms`` inclusive, at most ``limit``, by ``next_fire_ms`` again
    and again (the scheduler itself never lists them; it asks for the last one)."""
    out: list[int] = []
    at = after_ms
    while len(out) < limit and until_ms > after_ms:
        following = next_fire_ms(trigger, at)
        if following is None or following > until_ms:
            break
        out.append(following)
        at = following
    return out


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


ISSUED = ms("2026-03-07T12:00:00-05:00")


def test_one_shot_triggers_fire_once() -> None:
    assert first_fire_ms(Now(), ISSUED) == ISSUED
    assert first_fire_ms(At(ISSUED + 5_000), ISSUED) == ISSUED + 5_000
    assert first_fire_ms(At(ISSUED - 5_000), ISSUED) == ISSUED - 5_000  # late: due at once
    assert first_fire_ms(After(1_500), ISSUED) == ISSUED + 1_500
    for trigger in (Now(), At(ISSUED), After(10)):
        assert next_fire_ms(trigger, ISSUED) is None
        assert fires_between(trigger, ISSUED - HOUR, ISSUED + HOUR, 10) == []
        assert last_fire_between(trigger, ISSUED - HOUR, ISSUED + HOUR) is None


def test_every_starts_one_interval_after_issue_or_at_start_at() -> None:
    assert first_fire_ms(Every(90 * MINUTE), ISSUED) == ISSUED + 90 * MINUTE
    assert first_fire_ms(Every(90 * MINUTE, start_at_ms=ISSUED + 7), ISSUED) == ISSUED + 7


def test_every_counts_real_time_across_a_dst_change() -> None:
    # One hour after 01:30 EST on the spring-forward day is 03:30 EDT, not 02:30 wall time.
    before = ms("2026-03-08T01:30:00-05:00")
    assert next_fire_ms(Every(HOUR), before) == ms("2026-03-08T03:30:00-04:00")
    fall = ms("2026-11-01T01:30:00-04:00")
    assert next_fire_ms(Every(HOUR), fall) == ms("2026-11-01T01:30:00-05:00")


def test_every_rejects_a_non_positive_interval() -> None:
    for bad in (0, -5):
        with pytest.raises(ValidationError) as err:
            next_fire_ms(Every(bad), ISSUED)
        assert err.value.field == "trigger.interval_ms"
        with pytest.raises(ValidationError):
            fires_between(Every(bad), 0, HOUR, 10)


def test_cron_first_fire_is_strictly_after_issue() -> None:
    at_nine = ms("2026-05-04T09:00:00+02:00")
    trigger = Cron("0 9 * * *", "Europe/Berlin")
    assert first_fire_ms(trigger, at_nine) == ms("2026-05-05T09:00:00+02:00")
    assert first_fire_ms(trigger, at_nine - 1) == at_nine


def test_cron_uses_the_dst_rules() -> None:
    gap = Cron("30 2 * * *", "America/New_York")
    assert first_fire_ms(gap, ISSUED) == ms("2026-03-08T03:00:00-04:00")
    assert next_fire_ms(gap, ms("2026-03-08T03:00:00-04:00")) == ms("2026-03-09T02:30:00-04:00")
    once = Cron("30 1 * * *", "America/New_York")
    assert next_fire_ms(once, ms("2026-11-01T01:30:00-04:00")) == ms("2026-11-02T01:30:00-05:00")


def test_cron_invalid_expression_or_zone_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as err:
        first_fire_ms(Cron("61 * * * *", "UTC"), ISSUED)
    assert err.value.field == "cron"
    with pytest.raises(ValidationError) as err:
        next_fire_ms(Cron("* * * * *", "Mars/Olympus_Mons"), ISSUED)
    assert err.value.field == "timezone"


def test_fires_between_is_after_exclusive_until_inclusive_and_limited() -> None:
    every = Every(10 * MINUTE)
    assert fires_between(every, 0, 30 * MINUTE, 10) == [10 * MINUTE, 20 * MINUTE, 30 * MINUTE]
    assert fires_between(every, 0, 30 * MINUTE - 1, 10) == [10 * MINUTE, 20 * MINUTE]
    assert fires_between(every, 0, 30 * MINUTE, 2) == [10 * MINUTE, 20 * MINUTE]
    assert fires_between(every, 0, 30 * MINUTE, 0) == []
    assert fires_between(every, 30 * MINUTE, 30 * MINUTE, 10) == []

    hourly = Cron("0 * * * *", "America/New_York")
    after, until = ms("2026-11-01T00:30:00-04:00"), ms("2026-11-01T02:00:00-05:00")
    assert fires_between(hourly, after, until, 10) == [
        ms("2026-11-01T01:00:00-04:00"),
        ms("2026-11-01T01:00:00-05:00"),
        ms("2026-11-01T02:00:00-05:00"),
    ]
    assert fires_between(hourly, after, until, 1) == [ms("2026-11-01T01:00:00-04:00")]


def test_last_fire_between_finds_the_latest_missed_fire_without_iterating() -> None:
    every = Every(7 * MINUTE)
    assert last_fire_between(every, 0, 30 * MINUTE) == 28 * MINUTE
    assert last_fire_between(every, 0, 6 * MINUTE) is None
    # A year of per-second fires: arithmetic, not a year-long list.
    assert last_fire_between(Every(1_000), 0, 365 * 24 * HOUR + 999) == 365 * 24 * HOUR

    minutely = Cron("* * * * *", "UTC")
    after = ms("2026-01-01T00:00:00+00:00")
    until = ms("2026-02-01T00:00:30+00:00")
    assert last_fire_between(minutely, after, until) == ms("2026-02-01T00:00:00+00:00")
    assert last_fire_between(minutely, after, after + 59_999) is None

    daily = Cron("30 1 * * *", "America/New_York")
    # In the second pass of the repeated hour, the day's (single) fire was the first 01:30.
    assert last_fire_between(
        daily, ms("2026-10-31T12:00:00-04:00"), ms("2026-11-01T01:45:00-05:00")
    ) == ms("2026-11-01T01:30:00-04:00")


@pytest.mark.parametrize(
    "trigger",
    [
        Cron("*/30 * * * *", "America/New_York"),
        Cron("30 2 * * *", "Europe/Berlin"),
        Cron("*/15 * * * *", "Australia/Lord_Howe"),
        Every(25 * MINUTE),
    ],
)
def test_last_fire_between_agrees_with_fires_between(trigger: Every | Cron) -> None:
    for start in ("2026-03-07T22:00:00+00:00", "2026-03-28T22:00:00+00:00",
                  "2026-04-04T12:00:00+00:00", "2026-10-24T22:00:00+00:00",
                  "2026-10-31T22:00:00+00:00"):  # fmt: skip
        after = ms(start)
        for hours in (1, 3, 7, 30):
            until = after + hours * HOUR
            listed = fires_between(trigger, after, until, 10_000)
            assert last_fire_between(trigger, after, until) == (listed[-1] if listed else None)
