"""``jobwheel next`` and ``jobwheel scheduler`` as a user runs them."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from jobwheel.cli import main
from jobwheel.settings import Settings

# fixed dates: `jobwheel next --from` counts from the instant it is given, never the clock.


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_cron_gap_then_normal_days(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(
        capsys,
        "next", "--cron", "30 2 * * *", "--tz", "America/New_York",
        "--from", "2026-03-07T12:00:00-05:00", "--count", "3",
    )  # fmt: skip
    assert code == 0
    assert lines == [
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
        "2026-03-10T02:30:00-04:00",
    ]


def test_cron_fall_back_fixed_time_once(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(
        capsys,
        "next", "--cron", "30 1 * * *", "--tz", "America/New_York",
        "--from", "2026-10-31T12:00:00-04:00", "--count", "2",
    )  # fmt: skip
    assert code == 0
    assert lines == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]


def test_cron_fall_back_wildcard_by_the_clock(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(
        capsys,
        "next", "--cron", "*/30 * * * *", "--tz", "Europe/Berlin",
        "--from", "2026-10-25T01:45:00+02:00", "--count", "5",
    )  # fmt: skip
    assert code == 0
    assert lines == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]


def test_every_is_printed_in_utc(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(
        capsys, "next", "--every", "90m", "--from", "2026-03-07T12:00:00-05:00", "--count", "3"
    )
    assert code == 0
    assert lines == [
        "2026-03-07T18:30:00+00:00",
        "2026-03-07T20:00:00+00:00",
        "2026-03-07T21:30:00+00:00",
    ]


def test_every_with_milliseconds(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(
        capsys, "next", "--every", "250ms", "--from", "2026-01-01T00:00:00Z", "--count", "4"
    )
    assert code == 0
    assert lines == [
        "2026-01-01T00:00:00.250+00:00",
        "2026-01-01T00:00:00.500+00:00",
        "2026-01-01T00:00:00.750+00:00",
        "2026-01-01T00:00:01+00:00",
    ]


def test_default_count_and_start_is_now(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(capsys, "next", "--cron", "@hourly")
    assert code == 0
    assert len(lines) == 5
    assert all(line.endswith(":00:00+00:00") for line in lines)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--cron", "61 * * * *"], "cron"),
        (["--cron", "* * * *"], "cron"),
        (["--cron", "0 0 * * *", "--tz", "Mars/Olympus_Mons"], "timezone"),
        (["--every", "soon"], "every"),
        (["--every", "0s"], "every"),
        (["--every", "5m", "--tz", "Europe/Berlin"], "tz"),
        (["--every", "5m", "--count", "0"], "count"),
        (["--every", "5m", "--count", "many"], "count"),
        (["--every", "5m", "--from", "yesterday"], "from"),
        (["--every", "5m", "--from", "2026-01-01T00:00:00"], "from"),
    ],
)
def test_invalid_input_exits_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], argv: list[str], field: str
) -> None:
    code, lines, err = run(capsys, "next", *argv)
    assert code == 2
    assert lines == []
    assert err.startswith(f"jobwheel next: invalid {field}:")


def test_cron_and_every_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["next", "--cron", "* * * * *", "--every", "5m"])
    assert exc.value.code == 2


def test_scheduler_runs_streams_app_with_the_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Settings] = []
    fake = types.ModuleType("jobwheel.streams.app")
    fake.run_scheduler = lambda settings: seen.append(settings) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jobwheel.streams.app", fake)
    code, _, _ = run(capsys, "scheduler")
    assert code == 0
    assert len(seen) == 1 and isinstance(seen[0], Settings)


def test_scheduler_without_the_app_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "jobwheel.streams.app", None)
    code, _, err = run(capsys, "scheduler")
    assert code == 1
    assert "scheduler application (streams/app.py) is not part of this build" in err


def test_installed_command_prints_the_same() -> None:
    exe = Path(sys.executable).with_name("jobwheel")
    result = subprocess.run(
        [str(exe), "next", "--cron", "0 * * * *", "--tz", "Australia/Lord_Howe",
         "--from", "2026-04-05T00:30:00+11:00", "--count", "3"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # 01:00 daylight time; the :00 of the repeated half hour does not exist; 02:00 standard.
    assert result.stdout.splitlines() == [
        "2026-04-05T01:00:00+11:00",
        "2026-04-05T02:00:00+10:30",
        "2026-04-05T03:00:00+10:30",
    ]
