"""``jobwheel submit`` and the job-control commands, run as a user runs them (a subprocess)."""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import (
    After,
    CancelJob,
    ConcurrencyPolicy,
    Cron,
    Every,
    PauseJob,
    ResumeJob,
    ScheduleJob,
    TriggerJob,
)
from jobwheel.schemas.partitioning import partition_for
from tests.support import consume, jobwheel_argv, read_all, scaled


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobwheel_argv(["jobwheel", *args]),
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        stdin=subprocess.DEVNULL,
    )


INVALID = [
    (["--in", "5s"], "task"),
    (["--task", "bad task", "--in", "5s"], "task"),
    (["--task", "demo.echo"], "trigger"),
    (["--task", "demo.echo", "--now", "--in", "5s"], "trigger"),
    (["--task", "demo.echo", "--in", "5"], "in"),
    (["--task", "demo.echo", "--in", "0s"], "in"),
    (["--task", "demo.echo", "--every=-1m"], "every"),
    (["--task", "demo.echo", "--every", "-1m"], "argument --every"),
    (["--task", "demo.echo", "--now", "--bogus"], "unrecognized arguments"),
    (["--task", "demo.echo", "--at", "2030-01-01T10:00:00"], "at"),  # fixed date: no offset
    (["--task", "demo.echo", "--at", "2001-01-01T10:00:00Z"], "at"),
    (["--task", "demo.echo", "--at", "next tuesday"], "at"),
    (["--task", "demo.echo", "--cron", "61 * * * *"], "cron"),
    (["--task", "demo.echo", "--cron", "* * * *"], "cron"),
    (["--task", "demo.echo", "--cron", "0 9 * * *", "--tz", "Mars/Olympus"], "timezone"),
    (["--task", "demo.echo", "--now", "--args", "{x: 1}"], "args"),
    (["--task", "demo.echo", "--now", "--id", "has space"], "job_id"),
    (["--task", "demo.echo", "--now", "--max-attempts", "0"], "max_attempts"),
    (["--task", "demo.echo", "--now", "--max-attempts", "three"], "max_attempts"),
    (["--task", "demo.echo", "--now", "--timeout", "0ms"], "timeout"),
    (["--task", "demo.echo", "--now", "--visibility-timeout", "soon"], "visibility_timeout"),
    (["--task", "demo.echo", "--now", "--starting-deadline", "1x"], "starting_deadline"),
    (["--task", "demo.echo", "--now", "--concurrency-policy", "NEVER"], "concurrency_policy"),
    # hostile input: a traceback or a 10,000-character line before
    (["--task", "demo.echo", "--now", "--args", "[" * 5000 + "]" * 5000], "args"),
    (["--task", "demo.echo", "--now", "--args", '{"a": [' + "[" * 100 + "]" * 100 + "]}"], "args"),
    (["--task", "demo.echo", "--now", "--args", '"' + "x" * 100_000 + '"'], "args"),
    (["--task", "t" * 10_000, "--now"], "task"),
    (["--task", "../../etc/passwd", "--now"], "task"),
    (["--task", "demo.echo", "--now", "--id", "j" * 10_000], "job_id"),
    (["--task", "demo.echo", "--in", "99999999999999999999999d"], "in"),
    (["--task", "demo.echo", "--in", "9" * 5000 + "s"], "in"),
    (["--task", "demo.echo", "--now", "--max-attempts", "²"], "max_attempts"),
    (["--task", "demo.echo", "--now", "--max-attempts", "9" * 5000], "max_attempts"),
    (["--task", "demo.echo", "--cron", "* " * 3000], "cron"),
]


def test_invalid_submissions_exit_2_with_one_line_and_send_nothing(
    settings: Any, jobwheel_env: dict[str, str]
) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda a: run(jobwheel_env, "submit", *a[0]), INVALID))
    for (args, field), result in zip(INVALID, results, strict=True):
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        prefix = (
            "jobwheel submit: "
            if field.startswith(("argument", "unrecognized"))
            else ("jobwheel submit: invalid ")
        )
        assert lines[0].startswith(f"{prefix}{field}"), (args, lines[0])
        assert len(lines[0]) < 400, (field, lines[0][:500])
        assert result.stdout == ""
    bad_control = run(jobwheel_env, "cancel", "has space")
    assert bad_control.returncode == 2
    assert bad_control.stderr.strip().startswith("jobwheel cancel: invalid job_id: ")
    leaked = read_all(settings, settings.topics.requests)
    assert leaked == [], [default_codec().decode(m.value()) for m in leaked]


def test_submit_prints_the_job_id_and_the_command_is_on_the_topic(
    settings: Any, jobwheel_env: dict[str, str]
) -> None:
    result = run(jobwheel_env, "submit", "--task", "demo.echo", "--in", "5s", "--args", '{"x": 1}')
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", job_id)

    (msg,) = consume(settings, settings.topics.requests, min_count=1)
    command = default_codec().decode(msg.value())
    assert command.job_id == job_id
    assert msg.key() == job_id.encode()
    assert msg.partition() == partition_for(job_id, settings.partitions)
    assert command.body == ScheduleJob("demo.echo", After(5000), args_json='{"x":1}')


def test_submit_options_and_control_commands(settings: Any, jobwheel_env: dict[str, str]) -> None:
    cron = run(
        jobwheel_env,
        "submit",
        "--task",
        "demo.echo",
        "--id",
        "nightly",
        "--cron",
        "30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--max-attempts",
        "5",
        "--timeout",
        "1h30m",
        "--visibility-timeout",
        "250ms",
        "--starting-deadline",
        "10m",
        "--concurrency-policy",
        "forbid",
        "--idempotency-key",
        "k1",
    )
    assert (cron.returncode, cron.stdout.strip()) == (0, "nightly"), cron.stderr
    every = run(jobwheel_env, "submit", "--task", "demo.echo", "--id", "tick", "--every", "2s")
    assert every.returncode == 0, every.stderr
    printed = {}
    for kind in ("pause", "resume", "trigger", "cancel"):
        result = run(jobwheel_env, kind, "nightly", "--reason", f"by {kind}")
        assert result.returncode == 0, result.stderr
        printed[kind] = result.stdout.strip()

    msgs = consume(settings, settings.topics.requests, min_count=6)
    commands = [default_codec().decode(m.value()) for m in msgs]
    # No status API runs here: each command says it was sent and what the scheduler will do;
    # a trigger names its run, which the trigger's issue time names.
    (trigger,) = [c for c in commands if isinstance(c.body, TriggerJob)]
    assert printed == {
        "pause": "nightly: pause sent; the scheduler will make the job PAUSED",
        "resume": "nightly: resume sent; the scheduler will make the job SCHEDULED",
        "trigger": "nightly: trigger sent; the scheduler will dispatch run "
        f"nightly@trigger-{trigger.issued_at_ms}",
        "cancel": "nightly: cancel sent; the scheduler will make the job CANCELLED",
    }
    nightly = [c.body for c in commands if c.job_id == "nightly"]  # one partition: in order
    assert nightly == [
        ScheduleJob(
            "demo.echo",
            Cron("30 2 * * *", "Europe/Berlin"),
            max_attempts=5,
            timeout_ms=5_400_000,
            visibility_timeout_ms=250,
            starting_deadline_ms=600_000,
            concurrency_policy=ConcurrencyPolicy.FORBID,
            idempotency_key="k1",
        ),
        PauseJob("by pause"),
        ResumeJob("by resume"),
        TriggerJob("by trigger"),
        CancelJob("by cancel"),
    ]
    assert [c.body for c in commands if c.job_id == "tick"] == [
        ScheduleJob("demo.echo", Every(2000))
    ]


@pytest.mark.parametrize("args", [["submit", "--help"], ["cancel", "--help"]])
def test_help_works_without_a_broker(args: list[str], jobwheel_env: dict[str, str]) -> None:
    env = {**jobwheel_env, "JOBWHEEL_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    result = run(env, *args)
    assert result.returncode == 0 and "usage: jobwheel" in result.stdout


def test_an_unreachable_broker_is_one_line_naming_the_address(
    jobwheel_env: dict[str, str], figure: Any
) -> None:
    """`health`, `submit`, a job-control command and `topics ensure` with nothing listening at
    the bootstrap address: one line each, no librdkafka chatter, exit 1. How long each took is
    printed (a figure for the report, not an assertion)."""
    import time

    from jobwheel.deploy.broker import free_port

    address = f"127.0.0.1:{free_port()}"
    env = {**jobwheel_env, "JOBWHEEL_BOOTSTRAP_SERVERS": address}
    took = {}
    for args, stream in (
        (["health"], "stdout"),
        (["submit", "--task", "demo.echo", "--now"], "stderr"),
        (["cancel", "some-job"], "stderr"),
        (["topics", "ensure"], "stderr"),
    ):
        start = time.monotonic()
        result = run(env, *args)
        took[args[0]] = time.monotonic() - start
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        lines = getattr(result, stream).splitlines()
        other = result.stderr if stream == "stdout" else result.stdout
        assert len(lines) == 1 and other == "", (args, result.stdout, result.stderr)
        assert f"cannot reach Kafka at {address}" in lines[0] and "%3|" not in lines[0]
    figure("[broker down] " + ", ".join(f"{k} {v:.2f}s" for k, v in took.items()))


def test_a_missing_topic_is_one_line_for_submit(
    settings: Any, jobwheel_env: dict[str, str]
) -> None:
    env = {**jobwheel_env, "JOBWHEEL_TOPIC_PREFIX": f"{settings.topic_prefix}-none"}
    result = run(env, "submit", "--task", "demo.echo", "--now")
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "requests does not exist" in line and "jobwheel topics ensure" in line
