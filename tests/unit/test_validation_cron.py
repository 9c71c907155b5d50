"""Cron expressions and zones are refused at submit time with a message that says how to fix."""

from __future__ import annotations

import pytest

from jobwheel.errors import ValidationError
from jobwheel.schemas.cron import parse_cron, zone


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("*/15 2 * * *", "*/15 2 * * *"),
        ("  0   9 * *  1-5 ", "0 9 * * 1-5"),
        ("@daily", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
        ("0 0 29 2 *", "0 0 29 2 *"),
        ("0 12 * jan,jul mon", "0 12 * jan,jul mon"),
    ],
)
def test_valid_expressions_are_normalised(text: str, expression: str) -> None:
    schedule = parse_cron(text)
    assert schedule.expression == expression
    assert len(schedule.fields) == 5


def test_parsed_fields_expose_what_the_dst_rules_need() -> None:
    fixed = parse_cron("30 1 * * *")
    assert (fixed.minutes, fixed.hours, fixed.hour_is_wildcard) == ((30,), (1,), False)
    stepped = parse_cron("0 */6 * * *")
    assert stepped.hours == (0, 6, 12, 18) and stepped.hour_is_wildcard
    assert parse_cron("* * * * *").minutes is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "0 fields"),
        ("* * * *", "4 fields"),
        ("0 0 1 * * 5", "6 fields"),  # seconds/years forms are not cron's five fields
        ("61 * * * *", "not a valid cron"),
        ("* 24 * * *", "not a valid cron"),
        ("a b c d e", "not a valid cron"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
    ],
)
def test_invalid_expressions(text: str, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle) as info:
        parse_cron(text)
    assert info.value.field == "cron"


def test_non_string_cron() -> None:
    with pytest.raises(ValidationError):
        parse_cron(None)  # type: ignore[arg-type]


def test_zone() -> None:
    assert zone("America/New_York").key == "America/New_York"
    assert zone("UTC").key == "UTC"
    for bad in ("Mars/Olympus", "", " UTC", "../../etc/passwd", "/etc/localtime"):
        with pytest.raises(ValidationError) as info:
            zone(bad)
        assert info.value.field == "timezone"
        assert repr(bad) in str(info.value)
