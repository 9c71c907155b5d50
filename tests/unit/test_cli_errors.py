"""What a user of the ``jobwheel`` command sees when something is wrong: one line, never a
traceback. Real subprocesses; nothing here needs a broker (each command fails, or finishes,
before it would reach one)."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import jobwheel_argv, scaled

REPO = Path(__file__).resolve().parents[2]
NAIVE = "2030-01-01T10:00:00"  # fixed date: refused for its missing offset on any day
TOMORROW = f"{datetime.now(UTC) + timedelta(days=1):%Y-%m-%dT%H:%M:%SZ}"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobwheel_argv(["jobwheel", *args]),
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=scaled(60),
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("JOBWHEEL_LOG_LEVEL", "bogus", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("JOBWHEEL_LOG_FORMAT", "xml", "'json' or 'text'"),
        ("JOBWHEEL_KAFKA_CONFIG", "notjson", "not valid JSON"),
        ("JOBWHEEL_KAFKA_CONFIG", "[1, 2]", "a JSON object"),
        ("JOBWHEEL_PARTITIONS", "x", "a whole number"),
        ("JOBWHEEL_SCHEDULER_STATIC_MEMBERSHIP", "maybe", "true or false"),
        # a word that is no option would become the JVM's main class
        ("JOBWHEEL_BROKER_JVM_OPTIONS", "-Xlog:gc Xmx1g", "starting with '-' (e.g. "),
        ("JOBWHEEL_BROKER_JVM_OPTIONS", "-cp /tmp/x", "JVM options other than -cp"),
        ("JOBWHEEL_BROKER_JVM_OPTIONS", "-Dname='unclosed", "JVM options a shell could split"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable_and_the_form(
    variable: str, value: str, expected: str
) -> None:
    result = run("list", **{variable: value})
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"jobwheel list: {variable}"), line
    assert expected in line, line


def test_a_service_gets_the_same_one_line(tmp_path: Path) -> None:
    result = run("scheduler", JOBWHEEL_PARTITIONS="twelve", JOBWHEEL_DATA_DIR=str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "jobwheel scheduler: JOBWHEEL_PARTITIONS='twelve' is not valid: expected a whole number"
    ]


def test_a_running_service_says_its_last_word_as_a_json_log_line(tmp_path: Path) -> None:
    """Once its logging is set up, a service writes nothing but JSON lines, its fatal error
    included (a supervisor shows it, a log collector keeps it); in the text format it is the
    plain line of every other command."""
    import json

    result = run("worker", "--tasks", "no_such_module", JOBWHEEL_DATA_DIR=str(tmp_path))
    assert result.returncode == 1
    records = [json.loads(line) for line in result.stderr.splitlines()]  # JSON, or it fails
    assert records[-1]["level"] == "error" and records[-1]["command"] == "worker"
    assert "cannot import module 'no_such_module'" in records[-1]["msg"]
    text = run(
        "worker", "--tasks", "no_such_module", JOBWHEEL_DATA_DIR=str(tmp_path),
        JOBWHEEL_LOG_FORMAT="text",
    )  # fmt: skip
    assert text.returncode == 1
    (line,) = text.stderr.splitlines()
    assert line.startswith("jobwheel worker: --tasks: cannot import module 'no_such_module'")


def test_output_cut_short_by_its_reader_ends_quietly() -> None:
    """`jobwheel ... | head -1`: the reader goes away, the command stops without a traceback."""
    proc = subprocess.Popen(
        jobwheel_argv(["jobwheel", "next", "--every", "1m", "--count", "10000"]),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(scaled(60)) == 141
    assert first.strip() and err == ""


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["--at", NAIVE], f"add one, e.g. {NAIVE}+01:00"),
        (["--at", "2001-01-01T10:00:00Z"], "schedule it to run now instead"),
        (["--start-at", TOMORROW, "--in", "5s"], "only applies to an every"),
    ],
)
def test_submit_errors_speak_the_command_line(args: list[str], wanted: str) -> None:
    result = run("submit", "--task", "demo.echo", *args)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert wanted in line, line
    for python_speak in ("now=True", "datetime(", "tzinfo", "every="):
        assert python_speak not in line, line


def test_help_lists_every_command() -> None:
    result = run("--help")
    assert result.returncode == 0
    for command in ("submit", "cancel", "status", "list", "health", "up", "worker"):
        assert command in result.stdout
