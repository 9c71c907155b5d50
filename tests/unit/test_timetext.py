"""One grammar of durations and instants for every part (schemas/timetext.py): what the SDK,
``jobwheel submit``/``next``, the API's schedule fields and the status filters accept is the
same text, with the same answer."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobwheel.consumers.status import queries
from jobwheel.errors import ValidationError
from jobwheel.producers import validation as v
from jobwheel.schemas import timetext
from jobwheel.schemas import validation as rules

# fixed dates: every parse here is given NOW; none reads the clock or reaches a store.
NOW = 1_900_000_000_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("5s", 5000), ("1h30m", 5_400_000), ("2d", 172_800_000), ("1w", 604_800_000)],
)
def test_a_duration_means_the_same_to_the_sdk_and_to_the_status_filters(text: str, ms: int) -> None:
    assert v.parse_duration(text, "every") == timedelta(milliseconds=ms)
    assert v.duration_ms(text, "timeout") == timedelta(milliseconds=ms)
    assert queries.parse_time(text, "since", now=NOW) == NOW - ms


@pytest.mark.parametrize("text", ["5x", "1.5s", "1h 30m", "15 m", "-5s", "s"])  # "5": epoch ms
def test_what_is_not_a_duration_is_refused_everywhere(text: str) -> None:
    with pytest.raises(ValidationError, match="^every: "):
        v.parse_duration(text, "every")
    with pytest.raises(ValidationError, match="^since: "):
        queries.parse_time(text, "since", now=NOW)


def test_an_instant_needs_an_offset_everywhere() -> None:
    naive = "2030-01-01T09:00:00"
    for parse in (
        lambda: v.parse_instant(naive, "at"),
        lambda: queries.parse_time(naive, "at", now=NOW),
        lambda: timetext.instant_ms(naive, "at", now=NOW),
    ):
        with pytest.raises(ValidationError, match=r"no time zone offset; add one, e\.g\. .*Z"):
            parse()


def test_an_instant_with_an_offset_is_the_same_instant_everywhere() -> None:
    text = "2030-01-01T09:00:00+01:00"
    sdk_ms = int(v.parse_instant(text, "at").timestamp() * 1000)
    assert sdk_ms == queries.parse_time(text, "since", now=NOW) == 1_893_484_800_000
    assert queries.parse_time("2030-01-01T08:00:00Z", "since", now=NOW) == sdk_ms


def test_a_zero_age_is_now_but_a_zero_delay_is_refused() -> None:
    assert queries.parse_time("0s", "since", now=NOW) == NOW
    with pytest.raises(ValidationError, match="must be positive"):
        v.parse_duration("0s", "in")


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (250, "250ms"),
        (90_000, "1m30s"),
        (3_600_000, "1h"),
        (3_630_000, "1h"),  # 1h0m30s: the unit below the largest is 0, the rest is dropped
        (218_448_157_843, "2528d8h"),
    ],
)
def test_a_duration_is_written_back_in_the_grammar_it_is_read_in(ms: int, text: str) -> None:
    assert timetext.duration_text(ms) == text
    assert timetext.duration_text_ms(text, "x") <= ms


def test_a_time_too_far_in_the_past_says_how_far_in_the_grammar() -> None:
    """The issue's case: a date years off (a wrong year) read "is 2528 days, 8:02:37.843000 in
    the past", Python's timedelta text, in a message about a CLI that reads 2528d8h."""
    at = NOW - 218_448_157_843
    with pytest.raises(ValidationError) as caught:
        rules.not_too_old(at, NOW)
    message = str(caught.value)
    assert "is 2528d8h in the past (more than 1h ago)" in message, message
    assert "days," not in message and "8:02:37" not in message, message
