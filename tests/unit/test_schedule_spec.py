"""One definition of a job's schedule options (producers/spec.py) behind the SDK, ``jobwheel
submit`` and the API's ``POST /jobs``: the same names, the same defaults, and the same spec
for the same request written in each form."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta, timezone

import pytest

from jobwheel.consumers.status.api import ScheduleRequest, schedule_spec
from jobwheel.errors import ValidationError
from jobwheel.producers import cli as producers_cli
from jobwheel.producers.spec import SCHEDULE_KEYS, JobSpec, spec_from_mapping

LIMIT = 64 * 1024
#: A whole hour a day from now: the same instant in every form, never in the past.
AT = (datetime.now(UTC) + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)


def submit_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    producers_cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_the_cli_and_the_api_take_exactly_the_options_of_the_spec() -> None:
    parser = submit_parser()
    submit = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # and how to treat a task no live worker serves: not the job's, the sender's choice
    dests = {a.dest for a in submit.choices["submit"]._actions} - {"help", "require_worker"}
    assert dests == SCHEDULE_KEYS
    assert set(ScheduleRequest.model_fields) == SCHEDULE_KEYS


def test_the_same_request_in_every_form_is_the_same_spec() -> None:
    sdk = JobSpec(
        task="billing.send",
        job_id="j-1",
        args={"customer": 7},
        at=AT,
        max_attempts=5,
        timeout=timedelta(minutes=2),
        concurrency_policy="FORBID",
    )
    argv = [
        "submit", "--task", "billing.send", "--id", "j-1", "--args", '{"customer": 7}',
        "--at", AT.astimezone(timezone(timedelta(hours=1))).isoformat(),
        "--max-attempts", "5", "--timeout", "2m",
        "--concurrency-policy", "FORBID",
    ]  # fmt: skip
    cli = producers_cli.spec_from_args(submit_parser().parse_args(argv), LIMIT)
    body = {
        "task": "billing.send",
        "job_id": "j-1",
        "args": {"customer": 7},
        "at": AT.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "max_attempts": 5,
        "timeout": 120_000,
        "concurrency_policy": "FORBID",
    }
    api = schedule_spec(ScheduleRequest.model_validate(body), LIMIT)
    assert cli == api == sdk


def test_omitted_options_take_the_specs_defaults_in_every_form() -> None:
    cli = producers_cli.spec_from_args(
        submit_parser().parse_args(["submit", "--task", "t", "--in", "5s"]), LIMIT
    )
    api = schedule_spec(ScheduleRequest.model_validate({"task": "t", "in": "5s"}), LIMIT)
    assert cli == api == JobSpec(task="t", in_=timedelta(seconds=5))


def test_an_unknown_option_is_refused_by_name() -> None:
    with pytest.raises(ValidationError) as info:
        spec_from_mapping({"task": "t", "now": True, "retries": 3})
    assert info.value.field == "retries"
