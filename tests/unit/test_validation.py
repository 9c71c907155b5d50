"""A bad request is refused at the call site, naming the field, before anything is sent."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobwheel.errors import ValidationError
from jobwheel.producers import validation as v
from jobwheel.producers.client import JobSpec, build_schedule
from jobwheel.schemas import validation as rules
from jobwheel.schemas.models import (
    After,
    At,
    CancelJob,
    ConcurrencyPolicy,
    Cron,
    Every,
    JobCommand,
    Now,
    ScheduleJob,
)

NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
LIMIT = 1024


def build(**kwargs: object) -> JobCommand:
    kwargs.setdefault("task", "demo.echo")
    if not {"now", "at", "in_", "every", "cron"} & set(kwargs):
        kwargs["now"] = True
    return build_schedule(JobSpec(**kwargs), now_ms=NOW_MS, max_args_bytes=LIMIT)  # type: ignore[arg-type]


def field_of(**kwargs: object) -> str:
    with pytest.raises(ValidationError) as info:
        build(**kwargs)
    assert info.value.field in str(info.value)
    return info.value.field


def test_valid_request_builds_the_command() -> None:
    cmd = build(
        job_id="invoice-7",
        task="billing:invoice.send-v2",
        args={"customer": 7},
        cron="0 9 * * 1-5",
        tz="Europe/Berlin",
        max_attempts=5,
        timeout=timedelta(minutes=2),
        visibility_timeout=timedelta(seconds=10),
        starting_deadline=timedelta(minutes=5),
        concurrency_policy="forbid",
        idempotency_key="k-1",
    )
    assert cmd.job_id == "invoice-7"
    assert cmd.issued_at_ms == NOW_MS
    assert cmd.body == ScheduleJob(
        task="billing:invoice.send-v2",
        trigger=Cron("0 9 * * 1-5", "Europe/Berlin"),
        args_json='{"customer":7}',
        max_attempts=5,
        timeout_ms=120_000,
        visibility_timeout_ms=10_000,
        starting_deadline_ms=300_000,
        concurrency_policy=ConcurrencyPolicy.FORBID,
        idempotency_key="k-1",
    )


def test_defaults_and_generated_ids() -> None:
    a, b = build(), build()
    assert len(a.job_id) == 32 and int(a.job_id, 16) >= 0
    assert a.job_id != b.job_id and a.command_id != b.command_id
    assert a.body == ScheduleJob("demo.echo", Now())


@pytest.mark.parametrize(
    ("kwargs", "trigger"),
    [
        ({"now": True}, Now()),
        ({"in_": timedelta(seconds=5)}, After(5000)),
        ({"every": timedelta(minutes=1)}, Every(60_000)),
        (
            {"every": timedelta(seconds=2), "start_at": NOW + timedelta(seconds=30)},
            Every(2000, NOW_MS + 30_000),
        ),
        ({"at": NOW + timedelta(hours=1)}, At(NOW_MS + 3_600_000)),
        ({"at": datetime(2030, 6, 1, 14, 0, tzinfo=ZoneInfo("Europe/Berlin"))}, At(NOW_MS)),
        ({"cron": "@hourly"}, Cron("@hourly", "UTC")),
        # the CLI's text forms (schemas/timetext.py) mean the same in the SDK
        ({"at": "2030-06-01T13:00:00Z"}, At(NOW_MS + 3_600_000)),
        ({"at": "2030-06-01T14:00:00+02:00"}, At(NOW_MS)),
        ({"in_": "5s"}, After(5000)),
        ({"every": "1m", "start_at": "2030-06-01T12:00:30Z"}, Every(60_000, NOW_MS + 30_000)),
    ],
)
def test_triggers(kwargs: dict[str, object], trigger: object) -> None:
    assert build(**kwargs).body.trigger == trigger  # type: ignore[union-attr]


def test_slightly_past_at_is_accepted_and_fires_immediately() -> None:
    assert build(at=NOW - timedelta(minutes=59)).body.trigger == At(NOW_MS - 59 * 60_000)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "*/5 * * * *", "tz": "Mars/Olympus"}, "timezone"),
        ({"at": datetime(2030, 6, 1, 13, 0)}, "at"),  # naive
        ({"at": NOW - timedelta(hours=1, seconds=1)}, "at"),
        ({"at": "2030-06-01T13:00:00"}, "at"),  # text without an offset
        ({"at": "tomorrow"}, "at"),
        ({"at": 1_900_000_000_000}, "at"),  # epoch ms: the SDK takes a datetime or ISO text
        ({"in_": "5 s"}, "in"),
        ({"every": "0s"}, "every"),
        ({"timeout": "1y"}, "timeout"),
        ({"in_": timedelta(0)}, "in"),
        ({"in_": timedelta(seconds=-1)}, "in"),
        ({"in_": timedelta(microseconds=500)}, "in"),
        ({"every": timedelta(0)}, "every"),
        ({"every": timedelta(milliseconds=1)}, "every"),
        ({"every": timedelta(milliseconds=999)}, "every"),
        ({"every": 5.0}, "every"),
        ({"every": timedelta(seconds=1), "start_at": datetime(2030, 1, 1)}, "start_at"),
        ({"in_": timedelta(seconds=1), "start_at": NOW}, "start_at"),
        ({"args": {"x": object()}}, "args"),
        ({"args": {"x": float("nan")}}, "args"),
        ({"args": {"blob": "x" * LIMIT}}, "args"),
        ({"task": ""}, "task"),
        ({"task": "has space"}, "task"),
        ({"task": "a/b"}, "task"),
        ({"task": "x" * 201}, "task"),
        ({"task": "ok\n"}, "task"),
        ({"job_id": ""}, "job_id"),
        ({"job_id": "x" * 201}, "job_id"),
        ({"job_id": "a b"}, "job_id"),
        ({"job_id": "a\tb"}, "job_id"),
        ({"job_id": "a\x00b"}, "job_id"),
        ({"job_id": "a\u200bb"}, "job_id"),  # zero-width space is not printable
        ({"job_id": "\ud800"}, "job_id"),
        ({"job_id": 7}, "job_id"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"max_attempts": 2**31}, "max_attempts"),
        ({"timeout": timedelta(0)}, "timeout"),
        ({"visibility_timeout": timedelta(seconds=-5)}, "visibility_timeout"),
        ({"visibility_timeout": None}, "visibility_timeout"),
        ({"starting_deadline": timedelta(0)}, "starting_deadline"),
        ({"concurrency_policy": "SOMETIMES"}, "concurrency_policy"),
        ({"idempotency_key": "with space"}, "idempotency_key"),
    ],
)
def test_invalid_requests_name_the_field(kwargs: dict[str, object], field: str) -> None:
    assert field_of(**kwargs) == field


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"now": True, "in_": timedelta(seconds=1)},
        {"cron": "* * * * *", "every": timedelta(seconds=1)},
        {"at": NOW, "now": True},
    ],
)
def test_exactly_one_trigger(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        build_schedule(JobSpec(task="t", **kwargs), now_ms=NOW_MS, max_args_bytes=LIMIT)  # type: ignore[arg-type]
    assert info.value.field == "trigger"


def test_args_limit_counts_utf8_bytes() -> None:
    ok = "ü" * ((LIMIT - 20) // 2)
    assert build(args={"s": ok}).body.args_json  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="bytes"):
        build(args={"s": "ü" * (LIMIT // 2)})


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("5s", 5000), ("10m", 600_000), ("1h30m", 5_400_000), ("2d", 172_800_000)]
    + [("1w", 604_800_000)],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert v.parse_duration(text, "in") == timedelta(milliseconds=ms)


@pytest.mark.parametrize("text", ["", "5", "5x", "-5s", "1.5s", "0s", "s", "5 s s", "1h 30m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        v.parse_duration(text, "every")
    assert info.value.field == "every"


def test_parse_instant() -> None:
    assert v.parse_instant("2030-06-01T12:00:00Z") == NOW
    assert v.parse_instant("2030-06-01T14:00:00+02:00") == NOW
    for bad in ("2030-06-01T12:00:00", "tomorrow", ""):
        with pytest.raises(ValidationError, match="^at: "):
            v.parse_instant(bad)


def test_check_command_applies_the_same_rules_to_hand_built_commands() -> None:
    good = JobCommand("c", "j", NOW_MS, ScheduleJob("demo.echo", After(1)))
    assert rules.check_command(good, now_ms=NOW_MS, max_args_bytes=LIMIT) is good
    bad = [
        (JobCommand("c", "j j", NOW_MS, CancelJob()), "job_id"),
        (JobCommand("", "j", NOW_MS, CancelJob()), "command_id"),
        (JobCommand("c", "j", NOW_MS, ScheduleJob("demo.echo", After(0))), "in"),
        (JobCommand("c", "j", NOW_MS, ScheduleJob("demo.echo", At(0))), "at"),
        (JobCommand("c", "j", NOW_MS, ScheduleJob("demo.echo", Cron("bad"))), "cron"),
        (
            JobCommand("c", "j", NOW_MS, ScheduleJob("demo.echo", Cron("* * * * *", "X/Y"))),
            "timezone",
        ),
        (JobCommand("c", "j", NOW_MS, ScheduleJob("demo.echo", Now(), args_json="{")), "args"),
        (
            JobCommand("c", "j", NOW_MS, ScheduleJob("demo.echo", Now(), max_attempts=0)),
            "max_attempts",
        ),
        (JobCommand("c", "j", NOW_MS, ScheduleJob("demo.echo", Now(), timeout_ms=-1)), "timeout"),
        (JobCommand("c", "j", NOW_MS, CancelJob(reason=5)), "reason"),  # type: ignore[arg-type]
    ]
    for command, field in bad:
        with pytest.raises(ValidationError) as info:
            rules.check_command(command, now_ms=NOW_MS, max_args_bytes=LIMIT)
        assert info.value.field == field, command


def test_schedule_many_mappings_refuse_unknown_keys() -> None:
    from jobwheel.producers.client import _spec

    assert _spec({"task": "demo.echo", "now": True}) == JobSpec(task="demo.echo", now=True)
    with pytest.raises(ValidationError) as info:
        _spec({"task": "demo.echo", "in": timedelta(seconds=1)})
    assert info.value.field == "in"
    with pytest.raises(ValidationError) as info:
        _spec({"now": True})
    assert info.value.field == "task"


# --- the scheduler's argument check (check_args_text) gives parse_args_text's verdicts ---------

_ODD_JSON = [
    "{}", "[]", '{"a":1}', "1e400", "-1e400", "NaN", "[Infinity]", "-Infinity",
    "123456789012345678901234567890", '"\\ud800"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"',
    '"\ud800"', "\ufeff{}", '{"a":1,"a":2}', "[" * 65 + "]" * 65, "[" * 64 + "]" * 64,
    "[" * 2000 + "]" * 2000, '{"a":' * 70 + "1" + "}" * 70, "", " ", "{", "[1,]", "{'a':1}",
    '"\x00"', '"\\u0000"', "01", "1.", ".5", "-", "tru", "null", "true false",
    '"' + "é" * 300 + '"',
]  # fmt: skip


def _verdict(check: object, text: object, limit: int) -> str:
    try:
        check(text, limit)  # type: ignore[operator]
    except ValidationError as exc:
        return f"refused: {exc}"
    return "accepted"


@pytest.mark.parametrize("text", _ODD_JSON)
@pytest.mark.parametrize("limit", [LIMIT, 600, 4])
def test_the_scheduler_check_refuses_exactly_what_parse_refuses(text: str, limit: int) -> None:
    assert _verdict(rules.check_args_text, text, limit) == _verdict(
        rules.parse_args_text, text, limit
    )


def test_the_scheduler_check_refuses_what_is_not_text() -> None:
    for value in (None, b"{}", 1, ["{}"]):
        assert _verdict(rules.check_args_text, value, LIMIT) == _verdict(
            rules.parse_args_text, value, LIMIT
        )
        assert _verdict(rules.check_args_text, value, LIMIT).startswith("refused")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(
    value=_json_values,
    cut=st.integers(min_value=0, max_value=400),
    noise=st.text(alphabet='{}[]",:\\u0123456789abcdefeE.+-dD8 \n', max_size=6),
)
def test_the_scheduler_check_agrees_on_random_and_broken_json(
    value: object, cut: int, noise: str
) -> None:
    """Valid documents (NaN and infinities included, as ``json.dumps`` writes them), the same
    cut short or with noise spliced in."""
    text = json.dumps(value, ensure_ascii=bool(cut % 2))
    for candidate in (text, text[:cut], text[:cut] + noise + text[cut:]):
        for limit in (LIMIT, 64):
            assert _verdict(rules.check_args_text, candidate, limit) == _verdict(
                rules.parse_args_text, candidate, limit
            ), candidate


def test_the_sdk_takes_the_cli_text_for_times_and_durations() -> None:
    """`at="...Z"` used to raise "must be a datetime, got str" while the message for a naive
    datetime suggested an ISO string: the SDK now reads both forms by the CLI's grammar."""
    as_text = build(at="2030-06-01T13:00:00+01:00", timeout="2m", visibility_timeout="10s")
    as_values = build(
        at=NOW, timeout=timedelta(minutes=2), visibility_timeout=timedelta(seconds=10)
    )
    assert as_text.body == as_values.body
    with pytest.raises(ValidationError) as info:
        build(at="2030-06-01T13:00:00")
    assert str(info.value) == (
        "at: '2030-06-01T13:00:00' has no time zone offset; add one, e.g. "
        "2030-06-01T13:00:00+01:00 or 2030-06-01T13:00:00Z"
    )
    with pytest.raises(ValidationError) as info:
        build(at=1_900_000_000_000)
    assert str(info.value).startswith(
        "at: must be an aware datetime or an ISO 8601 time with an offset (e.g. "
    )
