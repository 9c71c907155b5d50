"""The contract's rules for a raw JobCommand (jobwheel.schemas.validation), as the scheduler applies
them.

A command written to the requests topic by hand, without the SDK, must get exactly the SDK's
verdict: these are the cases an attacker or a buggy service sent straight to Kafka, which the
scheduler must answer with REJECTED. Each message names the field and cuts long values.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
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

NOW_MS = int(datetime(2030, 6, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)
LIMIT = 64 * 1024


def schedule(job_id: str = "job-1", **body: object) -> JobCommand:
    body.setdefault("task", "demo.echo")
    body.setdefault("trigger", Now())
    return JobCommand("cmd-1", job_id, NOW_MS, ScheduleJob(**body))  # type: ignore[arg-type]


def verdict(command: JobCommand) -> ValidationError:
    """The scheduler's call: now is the command's own issue time, so a replay gets the same."""
    with pytest.raises(ValidationError) as info:
        rules.check_command(command, now_ms=command.issued_at_ms, max_args_bytes=LIMIT)
    error = info.value
    assert str(error).startswith(f"{error.field}: ")
    assert "\n" not in str(error)
    return error


@pytest.mark.parametrize(
    ("command", "field"),
    [
        (schedule(timeout_ms=-1), "timeout"),
        (schedule(timeout_ms=0), "timeout"),
        (schedule(visibility_timeout_ms=-1), "visibility_timeout"),
        (schedule(starting_deadline_ms=-5), "starting_deadline"),
        (schedule(args_json="not json"), "args"),
        (schedule(args_json="{'single': 'quotes'}"), "args"),
        (schedule(args_json='{"x": NaN}'), "args"),
        (schedule(args_json='"' + "x" * 300 * 1024 + '"'), "args"),
        (schedule(args_json="[" * 5000 + "]" * 5000), "args"),
        (schedule(args_json='{"s": "\\ud800"}'), "args"),
        (schedule(""), "job_id"),
        (schedule("x" * 10_000), "job_id"),
        (schedule("job\n1"), "job_id"),
        (schedule("job\r1"), "job_id"),
        (schedule(task="../../etc/passwd"), "task"),
        (schedule(task="x" * 10_000), "task"),
        (schedule(task=""), "task"),
        (schedule(max_attempts=0), "max_attempts"),
        (schedule(max_attempts=2**40), "max_attempts"),
        (schedule(trigger=After(-1)), "in"),
        (schedule(trigger=After(2**62)), "in"),
        (schedule(trigger=Every(0)), "every"),
        (schedule(trigger=Every(1)), "every"),  # floods ~600 runs/s from one job
        (schedule(trigger=Every(999)), "every"),
        (schedule(trigger=At(-1)), "at"),
        (schedule(trigger=At(NOW_MS - 2 * 3_600_000)), "at"),
        (schedule(trigger=At(10**23)), "at"),
        (schedule(trigger=Cron("* * * * *", "../../etc/passwd")), "timezone"),
        (schedule(trigger=Cron("x" * 10_000)), "cron"),
        (schedule(concurrency_policy="SOMETIMES"), "concurrency_policy"),  # type: ignore[arg-type]
        (schedule(idempotency_key="a b"), "idempotency_key"),
        (JobCommand("cmd-1", "job-1", -1, CancelJob()), "issued_at_ms"),
        (JobCommand("cmd-1", "job-1", 2**62, CancelJob()), "issued_at_ms"),
        (JobCommand("cmd 1", "job-1", NOW_MS, CancelJob()), "command_id"),
        (JobCommand("cmd-1", "job-1", NOW_MS, CancelJob("r" * 10_001)), "reason"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_raw_commands_the_sdk_refuses_are_refused(command: JobCommand, field: str) -> None:
    assert verdict(command).field == field


def test_long_values_are_cut_in_the_message() -> None:
    for command in (schedule(task="t" * 10_000), schedule("j" * 10_000)):
        message = str(verdict(command))
        assert len(message) < 300, message
        assert "…" in message


def test_valid_raw_command_passes_unchanged() -> None:
    command = schedule(
        args_json='{"customer": 7, "tags": ["a", "b"]}',
        trigger=Cron("0 9 * * 1-5", "Europe/Berlin"),
        timeout_ms=120_000,
        concurrency_policy=ConcurrencyPolicy.FORBID,
    )
    assert rules.check_command(command, now_ms=NOW_MS, max_args_bytes=LIMIT) is command


def test_size_limit_counts_the_text_as_sent_not_its_compact_form() -> None:
    padded = "{" + " " * LIMIT + '"x": 1}'
    assert verdict(schedule(args_json=padded)).field == "args"
    assert rules.args_text('{"x":  1}', LIMIT) == '{"x":1}'


def test_nesting_up_to_the_limit_is_accepted_deeper_is_refused() -> None:
    depth = rules.MAX_ARGS_DEPTH
    ok = "[" * depth + "]" * depth
    assert rules.args_text(ok, LIMIT) == ok
    assert "nested" in str(verdict(schedule(args_json="[" + ok + "]")))
    # brackets inside strings are text, not nesting
    assert rules.args_text(json.dumps("[" * 500), LIMIT)
    with pytest.raises(ValidationError, match="^args: nested"):
        rules.args_json(json.loads("[" * (depth + 1) + "]" * (depth + 1)), LIMIT)


def test_the_verdict_depends_on_the_command_only() -> None:
    """A command replayed a week later: ``at`` is checked against its own issue time."""
    command = schedule(trigger=At(NOW_MS - 30 * 60_000))
    assert rules.check_command(command, now_ms=command.issued_at_ms, max_args_bytes=LIMIT)
    old = schedule(trigger=At(NOW_MS - 2 * 3_600_000))
    for _ in range(2):
        assert verdict(old).field == "at"


def test_record_key_must_be_the_job_id_bytes() -> None:
    command = schedule("job-1")
    rules.check_key(b"job-1", command)
    for key, needle in ((None, "missing"), (b"job-2", "not the job id"), (b"", "not the job")):
        with pytest.raises(ValidationError, match=needle) as info:
            rules.check_key(key, command)
        assert info.value.field == "key"


# --- property tests: whatever comes in, the answer is a ValidationError or a valid command ---

_anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.binary(max_size=50),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    job_id=_anything,
    task=_anything,
    args_json=_anything,
    timeout_ms=_anything,
    max_attempts=_anything,
    delay=_anything,
    issued=_anything,
)
def test_hostile_fields_never_crash_the_rules(
    job_id: object,
    task: object,
    args_json: object,
    timeout_ms: object,
    max_attempts: object,
    delay: object,
    issued: object,
) -> None:
    command = JobCommand(
        "cmd-1",
        job_id,  # type: ignore[arg-type]
        issued,  # type: ignore[arg-type]
        ScheduleJob(
            task,  # type: ignore[arg-type]
            After(delay),  # type: ignore[arg-type]
            args_json=args_json,  # type: ignore[arg-type]
            max_attempts=max_attempts,  # type: ignore[arg-type]
            timeout_ms=timeout_ms,  # type: ignore[arg-type]
        ),
    )
    try:
        rules.check_command(command, now_ms=NOW_MS, max_args_bytes=LIMIT)
    except ValidationError as exc:
        assert len(str(exc)) < 500


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_hostile_text_forms_never_crash(text: str) -> None:
    for parse in (
        lambda: v.parse_duration(text, "in"),
        lambda: v.parse_instant(text, "at"),
        lambda: rules.args_text(text, LIMIT),
        lambda: rules.job_id(text),
        lambda: rules.task(text),
        lambda: rules.cron(text, "UTC"),
        lambda: rules.cron("* * * * *", text),
    ):
        try:
            parse()
        except ValidationError:
            pass


@settings(max_examples=200, deadline=None)
@given(
    job_id=st.text(min_size=1, max_size=30),
    args=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=20,
    ),
    delay_ms=st.integers(min_value=-5, max_value=2**63),
)
def test_what_the_sdk_builds_the_scheduler_accepts(
    job_id: str, args: object, delay_ms: int
) -> None:
    try:
        command = build_schedule(
            JobSpec(
                task="demo.echo",
                job_id=job_id,
                args=args,
                in_=timedelta(milliseconds=min(delay_ms, 10**15)),
            ),
            now_ms=NOW_MS,
            max_args_bytes=LIMIT,
        )
    except ValidationError:
        return
    assert rules.check_command(command, now_ms=command.issued_at_ms, max_args_bytes=LIMIT)
